package version

import (
	"bytes"
	"flag"
	"strings"
	"testing"
)

func TestFlag(t *testing.T) {
	old := version
	t.Cleanup(func() { version = old })
	version = "v1.2.3"
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	p := Flag(fs, "dowse-x")
	if err := fs.Parse([]string{"--version"}); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if !p.Print(&b) || !strings.HasPrefix(b.String(), "dowse-x v1.2.3 (go") {
		t.Fatalf("--version printed %q", b.String())
	}
	fs = flag.NewFlagSet("x", flag.ContinueOnError)
	p = Flag(fs, "dowse-x")
	_ = fs.Parse(nil)
	b.Reset()
	if p.Print(&b) || b.Len() != 0 {
		t.Fatalf("without --version: printed %q", b.String())
	}
}
