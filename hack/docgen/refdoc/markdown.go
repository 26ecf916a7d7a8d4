package refdoc

import (
	"fmt"
	"strings"
)

// The pages are read on the code host (GitHub-flavoured Markdown) and in
// the mkdocs site (Python-Markdown): what goes in a table cell is escaped so
// that both render it the same. Code is written as <code> with entities,
// because a backslash-escaped pipe inside a backtick span shows its
// backslash in Python-Markdown.

var textEscaper = strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", "|", "&#124;", "*", "&#42;", "\\", "&#92;", "\n", " ")

// code is s as inline code, safe in a table cell.
func code(s string) string {
	if !strings.ContainsAny(s, "|`\n") && strings.TrimSpace(s) == s && s != "" {
		return "`" + s + "`"
	}
	return "<code>" + textEscaper.Replace(s) + "</code>"
}

// text is prose from a comment or a schema description as Markdown for a
// table cell: `quoted` spans become code, a blank line a line break, and
// nothing in it is taken for HTML or table syntax.
func text(s string) string { return markdown(s, "<br><br>") }

// prose is text as paragraphs outside a table.
func prose(s string) string { return markdown(s, "\n\n") }

func markdown(s, paragraphBreak string) string {
	s = strings.TrimSpace(s)
	var paras []string
	for _, p := range strings.Split(s, "\n\n") {
		parts := strings.Split(strings.TrimSpace(p), "`")
		var b strings.Builder
		for i, part := range parts {
			switch {
			case i%2 == 1 && i < len(parts)-1:
				b.WriteString(code(part))
			case i%2 == 1: // an unpaired backquote
				b.WriteString("&#96;" + textEscaper.Replace(part))
			default:
				b.WriteString(textEscaper.Replace(part))
			}
		}
		if t := strings.TrimSpace(b.String()); t != "" {
			paras = append(paras, t)
		}
	}
	return strings.Join(paras, paragraphBreak)
}

// anchor is the id both GitHub and mkdocs (Python-Markdown's toc) give a
// heading of plain words: lower case, punctuation dropped, spaces as
// hyphens.
func anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// page builds one Markdown page and refuses two headings with one anchor,
// which would send a link to the wrong one.
type page struct {
	b       strings.Builder
	anchors map[string]string
	err     error
}

func newPage() *page { return &page{anchors: map[string]string{}} }

func (p *page) printf(format string, args ...any) { fmt.Fprintf(&p.b, format, args...) }

// heading writes a heading of level and returns its anchor.
func (p *page) heading(level int, title string) string {
	a := anchor(title)
	if prev, ok := p.anchors[a]; ok && p.err == nil {
		p.err = fmt.Errorf("headings %q and %q have the same anchor #%s", prev, title, a)
	}
	p.anchors[a] = title
	p.printf("%s %s\n\n", strings.Repeat("#", level), title)
	return a
}

// table writes a table; cells are Markdown already escaped for it.
func (p *page) table(header []string, rows [][]string) {
	p.printf("| %s |\n|%s\n", strings.Join(header, " | "), strings.Repeat(" --- |", len(header)))
	for _, r := range rows {
		p.printf("| %s |\n", strings.Join(r, " | "))
	}
	p.printf("\n")
}

func (p *page) bytes() ([]byte, error) {
	if p.err != nil {
		return nil, p.err
	}
	return []byte(p.b.String()), nil
}
