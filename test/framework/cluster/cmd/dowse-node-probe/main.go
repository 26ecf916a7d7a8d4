// Command dowse-node-probe is the workload of the node tests: a static binary
// that reports what its container sees, one line per argument, on stdout
// (where the kubelet's log and the API's pod log read it):
//
//	echo:TEXT      prints TEXT
//	env:NAME       prints "env NAME=value" (or "env NAME unset")
//	dev:PATH       prints "dev PATH char|block|other|missing"
//	sleep:DURATION sleeps (e.g. sleep:1h) before the next argument
//	cat:           copies stdin to stdout until its end (an exec's stdin)
//	serve:PORT     serves GET /bytes?n=N, N bytes of Bytes (blocks)
//	ticks:PERIOD   prints "tick 1", "tick 2", ... every PERIOD (blocks)
//	link:PATH      makes PATH a symbolic link to this binary (link:/bin/tar
//	               lets kubectl cp run its tar in the container)
//
// Run as tar (through such a link) it is the tar kubectl cp runs in a
// container: "tar cf - PATH..." writes PATH (files and folders) to stdout,
// "tar -xmf - [-C DIR]" extracts stdin into DIR (GNU tar's flags that
// kubectl adds besides are taken and ignored).
package main

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

func main() {
	if filepath.Base(os.Args[0]) == "tar" {
		if err := tarMain(os.Args[1:]); err != nil {
			fmt.Fprintln(os.Stderr, "tar:", err)
			os.Exit(2)
		}
		return
	}
	for _, a := range os.Args[1:] {
		kind, val, _ := strings.Cut(a, ":")
		switch kind {
		case "echo":
			fmt.Println(val)
		case "env":
			if v, ok := os.LookupEnv(val); ok {
				fmt.Printf("env %s=%s\n", val, v)
			} else {
				fmt.Printf("env %s unset\n", val)
			}
		case "dev":
			fmt.Printf("dev %s %s\n", val, devKind(val))
		case "cat":
			if _, err := io.Copy(os.Stdout, os.Stdin); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
		case "serve":
			http.HandleFunc("/bytes", func(w http.ResponseWriter, r *http.Request) {
				n, err := strconv.ParseInt(r.URL.Query().Get("n"), 10, 64)
				if err != nil || n < 0 {
					http.Error(w, "n: a byte count", http.StatusBadRequest)
					return
				}
				w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
				_, _ = io.CopyN(w, Bytes(), n)
			})
			srv := &http.Server{Addr: ":" + val, ReadHeaderTimeout: 10 * time.Second}
			fmt.Fprintln(os.Stderr, srv.ListenAndServe())
			os.Exit(2)
		case "ticks":
			d, err := time.ParseDuration(val)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
			for i := 1; ; i++ {
				fmt.Printf("tick %d\n", i)
				time.Sleep(d)
			}
		case "link":
			self, err := os.Executable()
			if err == nil {
				err = os.MkdirAll(filepath.Dir(val), 0o755)
			}
			if err == nil {
				err = os.Symlink(self, val)
			}
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
		case "sleep":
			d, err := time.ParseDuration(val)
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(2)
			}
			time.Sleep(d)
		default:
			fmt.Fprintf(os.Stderr, "unknown probe %q\n", a)
			os.Exit(2)
		}
	}
}

func devKind(path string) string {
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return "missing"
	case fi.Mode()&os.ModeCharDevice != 0:
		return "char"
	case fi.Mode()&os.ModeDevice != 0:
		return "block"
	default:
		return "other"
	}
}

// Bytes is the endless stream serve: sends, the same on every call (a test
// reads it again to check what arrived).
func Bytes() io.Reader {
	return rand.NewChaCha8([32]byte{'d', 'o', 'w', 's', 'e'})
}

// tarMain is the tar kubectl cp runs: create ("c") to or extract ("x")
// from the archive "-" (stdout, stdin).
func tarMain(args []string) error {
	var mode byte
	dir := "."
	var paths []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-C" && i+1 < len(args):
			i++
			dir = args[i]
		case a == "-":
		case strings.HasPrefix(a, "--"): // --no-same-owner, --no-same-permissions
		case mode == 0 && strings.ContainsAny(strings.TrimPrefix(a, "-"), "cx") && strings.Contains(a, "f"):
			if strings.Contains(a, "c") {
				mode = 'c'
			} else {
				mode = 'x'
			}
		default:
			paths = append(paths, a)
		}
	}
	switch mode {
	case 'c':
		return tarCreate(os.Stdout, paths)
	case 'x':
		return tarExtract(os.Stdin, dir)
	}
	return fmt.Errorf("unsupported arguments %q", args)
}

func tarCreate(w io.Writer, paths []string) error {
	tw := tar.NewWriter(w)
	for _, root := range paths {
		err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			if !fi.Mode().IsRegular() && !fi.IsDir() {
				return nil
			}
			h, err := tar.FileInfoHeader(fi, "")
			if err != nil {
				return err
			}
			h.Name = strings.TrimPrefix(filepath.ToSlash(p), "/") // as GNU tar does
			if fi.IsDir() {
				h.Name += "/"
			}
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			if fi.IsDir() {
				return nil
			}
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = io.Copy(tw, f)
			return err
		})
		if err != nil {
			return err
		}
	}
	return tw.Close()
}

func tarExtract(r io.Reader, dir string) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		name := filepath.Clean(strings.TrimPrefix(h.Name, "/"))
		if name == ".." || strings.HasPrefix(name, "../") {
			return fmt.Errorf("%q leaves the folder", h.Name)
		}
		p := filepath.Join(dir, name)
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				return err
			}
			f, err := os.OpenFile(p, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, fs.FileMode(h.Mode)&0o777)
			if err != nil {
				return err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
		}
	}
}
