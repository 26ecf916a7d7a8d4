// Package tutorials runs the tutorials under docs/tutorials against the
// demo's cluster (hack/demo --tutorial), so that what they say stays true.
//
// A tutorial's Markdown is read this way (see Parse):
//
//   - A ```sh block is run: the blocks of one tutorial go, in order, to one
//     bash (set -euo pipefail) in a fresh folder, as a reader types them
//     into one terminal after `source bin/demo/env`: variables, the
//     working directory and background jobs carry over from block to
//     block. A command that fails fails the tutorial.
//   - A ```text block right after a ```sh block (prose between them is
//     fine, another block is not) is what that block prints: each of its
//     lines, with runs of blanks taken as one, must be found in the
//     output's lines, in order (other output lines may come between).
//   - A block right under a line `<!-- file: PATH -->` is a file the reader
//     saves: it is written to PATH, relative to the shell's working
//     directory at that point, and not run.
//   - Other blocks (```yaml, ```go with no file marker) are shown only;
//     ```bash, ```shell and ```console are refused, so that no command is
//     shown that the test does not run.
//
// Fences start at the beginning of a line: Python-Markdown (mkdocs 1.4)
// does not render fenced code inside list items anyway.
package tutorials

import (
	"bufio"
	"fmt"
	"regexp"
	"strings"
)

// Block is one step of a tutorial.
type Block struct {
	// Line is the fence's line number (from 1), for messages.
	Line int
	// Kind is BlockRun, BlockFile or BlockShown.
	Kind BlockKind
	// Lang is the fence's info string.
	Lang string
	// Text is the block's content, ending with a newline.
	Text string
	// Path is a file block's path.
	Path string
	// Expect are the lines a run block's output must hold (its ```text
	// block), blanks collapsed.
	Expect []string
}

// BlockKind says what the test does with a block.
type BlockKind int

const (
	// BlockRun is a ```sh block.
	BlockRun BlockKind = iota
	// BlockFile is a block under a file marker.
	BlockFile
	// BlockShown is shown only.
	BlockShown
)

var (
	fenceOpen  = regexp.MustCompile("^```([A-Za-z0-9_+-]*)\\s*$")
	fileMarker = regexp.MustCompile(`^<!--\s*file:\s*(\S+)\s*-->\s*$`)
	blanks     = regexp.MustCompile(`\s+`)
)

// Parse reads a tutorial's blocks; text blocks become the Expect of the
// run block before them.
func Parse(md string) ([]Block, error) {
	var (
		blocks   []Block
		lastRun  = -1 // index of the run block a text block may follow
		prevLine string
		sc       = bufio.NewScanner(strings.NewReader(md))
		n        int
	)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		n++
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") && !strings.HasPrefix(line, "```") {
			return nil, fmt.Errorf("line %d: an indented fence (in a list item?): mkdocs 1.4 would not render it, and the test reads fences at the start of a line only", n)
		}
		m := fenceOpen.FindStringSubmatch(line)
		if m == nil {
			if strings.TrimSpace(line) != "" {
				prevLine = line
			}
			continue
		}
		b := Block{Line: n, Lang: m[1]}
		var body strings.Builder
		closed := false
		for sc.Scan() {
			n++
			if strings.TrimRight(sc.Text(), " \t") == "```" {
				closed = true
				break
			}
			body.WriteString(sc.Text())
			body.WriteByte('\n')
		}
		if !closed {
			return nil, fmt.Errorf("line %d: the block is never closed", b.Line)
		}
		b.Text = body.String()
		fm := fileMarker.FindStringSubmatch(prevLine)
		prevLine = ""
		switch {
		case fm != nil:
			b.Kind, b.Path = BlockFile, fm[1]
			lastRun = -1
		case b.Lang == "sh":
			b.Kind = BlockRun
			blocks = append(blocks, b)
			lastRun = len(blocks) - 1
			continue
		case b.Lang == "text" && lastRun >= 0:
			for _, l := range strings.Split(b.Text, "\n") {
				if l = strings.TrimSpace(blanks.ReplaceAllString(l, " ")); l != "" {
					blocks[lastRun].Expect = append(blocks[lastRun].Expect, l)
				}
			}
			lastRun = -1
			continue
		case b.Lang == "bash" || b.Lang == "shell" || b.Lang == "console":
			return nil, fmt.Errorf("line %d: a ```%s block: commands go in ```sh blocks, which the test runs", b.Line, b.Lang)
		default:
			b.Kind = BlockShown
			lastRun = -1
		}
		blocks = append(blocks, b)
	}
	return blocks, sc.Err()
}

// Missing returns the first of want's lines not found in out's lines, in
// order, blanks collapsed; "" when all are there.
func Missing(out string, want []string) string {
	lines := strings.Split(out, "\n")
	i := 0
	for _, w := range want {
		found := false
		for ; i < len(lines); i++ {
			if strings.Contains(blanks.ReplaceAllString(lines[i], " "), w) {
				found = true
				i++
				break
			}
		}
		if !found {
			return w
		}
	}
	return ""
}
