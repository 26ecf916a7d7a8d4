// Package version is the version of every Dowse binary, stamped at build
// time by the Makefile:
//
//	go build -ldflags "-X github.com/dowse-dev/dowse/internal/version.version=v0.1.0" ...
//
// Without it a binary reports its main module's version (go install
// module@version), else "dev". It imports only the standard library, so
// handlers and mappers use it too.
package version

import (
	"flag"
	"fmt"
	"io"
	"runtime"
	"runtime/debug"
)

// version is set with -ldflags -X at build time.
var version string

// Get returns the binary's version.
func Get() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

// Line is what --version prints: the binary's name, its version and the Go
// that built it, e.g. "dowse-agent v0.1.0 (go1.26.8 linux/amd64)".
func Line(binary string) string {
	return fmt.Sprintf("%s %s (%s %s/%s)", binary, Get(), runtime.Version(), runtime.GOOS, runtime.GOARCH)
}

// Flag registers --version on fs. After fs.Parse, Print(w) reports whether
// it was given and, if so, prints Line(binary) to w: main then exits 0.
func Flag(fs *flag.FlagSet, binary string) *Printer {
	p := &Printer{binary: binary}
	fs.BoolVar(&p.set, "version", false, "print the version and exit")
	return p
}

// Printer is the --version flag of one binary.
type Printer struct {
	binary string
	set    bool
}

// Print prints the version line to w when --version was given and reports
// whether it was.
func (p *Printer) Print(w io.Writer) bool {
	if p.set {
		fmt.Fprintln(w, Line(p.binary))
	}
	return p.set
}
