// Package docs checks the documentation: the site under docs/ builds with
// mkdocs --strict and no warning (hack/docs.sh, as `make docs` runs it),
// every page is in mkdocs.yml's nav, every link between pages lands on a
// heading that exists both in the built site and on the code host, and the
// README stays short.
package docs

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"

	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

// maxREADME keeps the README an entrance, not the manual (issue 40).
const maxREADME = 16 * 1024

func TestREADMEIsShort(t *testing.T) {
	fi, err := os.Stat(filepath.Join(kube.RepoRoot(), "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() >= maxREADME {
		t.Errorf("README.md is %d bytes, at most %d: move the detail into docs/", fi.Size(), maxREADME-1)
	}
}

func TestSiteBuildsStrict(t *testing.T) {
	if _, err := exec.LookPath("mkdocs"); err != nil {
		npmpeer.Unavailable(t, "mkdocs is not on PATH: run hack/install-deps.sh (Debian's mkdocs package)")
	}
	root := kube.RepoRoot()
	site := t.TempDir()
	cmd := exec.Command(filepath.Join(root, "hack", "docs.sh"), site)
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("hack/docs.sh (make docs) failed: %v\n%s", err, out)
	}

	// mkdocs 1.4 checks that a linked page exists, not the heading a link
	// names; the code host needs the heading too, under its own slugs.
	pages := markdownFiles(t, filepath.Join(root, "docs"))
	pages = append(pages, filepath.Join(root, "README.md"))
	for _, page := range pages {
		checkAnchors(t, root, site, page)
	}
}

// markdownFiles lists the .md files under dir.
func markdownFiles(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

var (
	fence    = regexp.MustCompile("(?ms)^\\s*```.*?^\\s*```")
	codeSpan = regexp.MustCompile("`[^`\n]*`")
	mdLink   = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	heading  = regexp.MustCompile(`(?m)^#{1,6}\s+(.+?)\s*#*\s*$`)
	htmlID   = regexp.MustCompile(`id="([^"]+)"`)
)

// checkAnchors fails for each link of page to a missing file, or to a
// heading that is missing from the built page or from the Markdown source
// (as the code host slugs it).
func checkAnchors(t *testing.T, root, site, page string) {
	t.Helper()
	src, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	text := codeSpan.ReplaceAll(fence.ReplaceAll(src, nil), nil)
	rel, _ := filepath.Rel(root, page)
	for _, m := range mdLink.FindAllSubmatch(text, -1) {
		link := string(m[1])
		if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
			continue
		}
		path, frag, _ := strings.Cut(link, "#")
		target := page
		if path != "" {
			target = filepath.Join(filepath.Dir(page), path)
			if _, err := os.Stat(target); err != nil {
				t.Errorf("%s: link %q: %v", rel, link, err)
				continue
			}
		}
		if frag == "" || !strings.HasSuffix(target, ".md") {
			continue
		}
		if !hostSlugs(t, target)[frag] {
			relTarget, _ := filepath.Rel(root, target)
			t.Errorf("%s: link %q: no heading %q in %s as the code host names them", rel, link, frag, relTarget)
		}
		docs := filepath.Join(root, "docs")
		if inDocs, err := filepath.Rel(docs, target); err == nil && !strings.HasPrefix(inDocs, "..") {
			if !siteIDs(t, site, inDocs)[frag] {
				t.Errorf("%s: link %q: no id %q on the built page of %s", rel, link, frag, inDocs)
			}
		}
	}
}

// siteIDs returns the element ids of the built page of docs/<page>
// (use_directory_urls: a/b.md is a/b/index.html, a/index.md a/index.html).
func siteIDs(t *testing.T, site, page string) map[string]bool {
	t.Helper()
	p := strings.TrimSuffix(page, ".md")
	if filepath.Base(p) == "index" {
		p = filepath.Dir(p)
	}
	b, err := os.ReadFile(filepath.Join(site, p, "index.html"))
	if err != nil {
		t.Fatalf("built page of %s: %v", page, err)
	}
	ids := map[string]bool{}
	for _, m := range htmlID.FindAllSubmatch(b, -1) {
		ids[string(m[1])] = true
	}
	return ids
}

// hostSlugs returns the anchors a code host (GitHub) gives the headings of
// a Markdown file: lower case, punctuation dropped, each space a hyphen.
func hostSlugs(t *testing.T, file string) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	slugs := map[string]bool{}
	for _, m := range heading.FindAllSubmatch(fence.ReplaceAll(b, nil), -1) {
		slugs[hostSlug(string(m[1]))] = true
	}
	return slugs
}

var inlineLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

func hostSlug(h string) string {
	h = inlineLink.ReplaceAllString(h, "$1")
	var b bytes.Buffer
	for _, r := range strings.ToLower(h) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}
