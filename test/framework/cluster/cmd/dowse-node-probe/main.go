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
package main

import (
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
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
