package refdoc

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// CLIPage is the reference of a cobra command tree: each command with its
// usage, description, examples and flags. The flags in common (kubectl's
// connection flags, which every command takes) are listed once, under
// commonTitle, and left out of every command; so is -h, --help.
//
// Long descriptions written for a terminal (indented lines: aligned
// columns, numbered steps) are kept as preformatted text; plain
// paragraphs become Markdown paragraphs.
func CLIPage(root *cobra.Command, intro string, common *pflag.FlagSet, commonTitle, commonText string) ([]byte, error) {
	// What Execute would add: the help and completion commands, the
	// version flag.
	root.InitDefaultVersionFlag()
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()

	var cmds []*cobra.Command
	var visit func(c *cobra.Command)
	visit = func(c *cobra.Command) {
		cmds = append(cmds, c)
		for _, ch := range c.Commands() { // sorted by name
			if ch.IsAvailableCommand() && !ch.IsAdditionalHelpTopicCommand() {
				visit(ch)
			}
		}
	}
	visit(root)

	p := newPage()
	p.heading(1, root.Name()+" commands")
	p.printf("%s\n\n", intro)
	var list []string
	for _, c := range cmds {
		list = append(list, fmt.Sprintf("- [%s](#%s): %s", c.CommandPath(), anchor(c.CommandPath()), text(c.Short)))
	}
	p.printf("%s\n\n", strings.Join(list, "\n"))

	skip := map[string]bool{"help": true}
	if common != nil {
		p.heading(2, commonTitle)
		p.printf("%s\n\n", commonText)
		p.table([]string{"Flag", "Type", "Default", "Description"}, flagRows(common, nil))
		common.VisitAll(func(f *pflag.Flag) { skip[f.Name] = true })
	}

	for _, c := range cmds {
		p.heading(2, c.CommandPath())
		p.printf("%s\n\n", text(c.Short))
		if c.Runnable() {
			p.printf("```text\n%s\n```\n\n", c.UseLine())
		}
		if len(c.Aliases) > 0 {
			p.printf("Aliases: %s.\n\n", backquoteAll(c.Aliases))
		}
		if c.Long != "" {
			p.printf("%s\n\n", longText(c.Long))
		}
		if c.Example != "" {
			p.printf("Examples:\n\n```text\n%s\n```\n\n", strings.TrimRight(c.Example, "\n"))
		}
		if rows := flagRows(c.LocalFlags(), skip); len(rows) > 0 {
			p.printf("Flags:\n\n")
			p.table([]string{"Flag", "Type", "Default", "Description"}, rows)
		}
		if rows := flagRows(c.InheritedFlags(), skip); len(rows) > 0 {
			p.printf("Flags of its parent commands:\n\n")
			p.table([]string{"Flag", "Type", "Default", "Description"}, rows)
		}
		var subs []string
		for _, ch := range c.Commands() {
			if ch.IsAvailableCommand() && !ch.IsAdditionalHelpTopicCommand() {
				subs = append(subs, fmt.Sprintf("- [%s](#%s): %s", ch.CommandPath(), anchor(ch.CommandPath()), text(ch.Short)))
			}
		}
		if len(subs) > 0 {
			p.printf("Commands:\n\n%s\n\n", strings.Join(subs, "\n"))
		}
	}
	return p.bytes()
}

// longText is a command's long description as Markdown: preformatted when
// it was laid out for a terminal, paragraphs otherwise.
func longText(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.HasPrefix(l, " ") || strings.HasPrefix(l, "\t") {
			return "```text\n" + strings.TrimRight(s, "\n") + "\n```"
		}
	}
	return prose(s)
}

// flagRows lists fs's visible flags but those in skip, in name order.
func flagRows(fs *pflag.FlagSet, skip map[string]bool) [][]string {
	var rows [][]string
	fs.VisitAll(func(f *pflag.Flag) { // sorted by name
		if f.Hidden || skip[f.Name] {
			return
		}
		name := "--" + f.Name
		if f.Shorthand != "" && f.ShorthandDeprecated == "" {
			name = "-" + f.Shorthand + ", " + name
		}
		typ, usage := pflag.UnquoteUsage(f)
		if f.Value.Type() == "bool" {
			typ = "bool"
		} else if f.NoOptDefVal != "" {
			name += "[=" + f.NoOptDefVal + "]"
		}
		def := ""
		if !zeroDefault(f.DefValue) {
			def = code(f.DefValue)
		}
		desc := text(usage)
		if f.Deprecated != "" {
			desc += " Deprecated: " + text(f.Deprecated)
		}
		rows = append(rows, []string{code(name), typ, def, desc})
	})
	return rows
}

// zeroDefault says a default is the zero value, which pflag's help leaves
// out too.
func zeroDefault(v string) bool {
	switch v {
	case "", "false", "0", "0s", "[]", "<nil>":
		return true
	}
	return false
}
