// Package debugecho is the sample broker for debug-echo devices: it logs the
// device environment the device plugin gave its container and serves it over
// HTTP, so a person can see discovery, allocation and Services work end to
// end.
package debugecho

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/go-logr/logr"
)

// Config is what Run needs.
type Config struct {
	// Listen is the HTTP address, e.g. ":8080".
	Listen string
	// Prefixes select the environment variables that describe the device.
	Prefixes []string
	Logger   logr.Logger
	// Environ returns the environment; os.Environ when nil (tests set it).
	Environ func() []string
	// Once logs the device environment and returns without serving, as a
	// Job broker that handles its device once and completes. It fails when
	// there is no device environment, so a Job that got no device is seen
	// failing rather than succeeding.
	Once bool
}

// Reply is what the broker serves.
type Reply struct {
	Hostname string            `json:"hostname"`
	Device   map[string]string `json:"device"`
}

// DeviceEnv picks the variables with one of the prefixes.
func DeviceEnv(environ []string, prefixes []string) map[string]string {
	out := map[string]string{}
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			continue
		}
		for _, p := range prefixes {
			if strings.HasPrefix(k, p) {
				out[k] = v
				break
			}
		}
	}
	return out
}

// Run logs the device environment and serves it until ctx ends.
func Run(ctx context.Context, cfg Config) error {
	environ := cfg.Environ
	if environ == nil {
		environ = os.Environ
	}
	dev := DeviceEnv(environ(), cfg.Prefixes)
	keys := make([]string, 0, len(dev))
	for k := range dev {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		cfg.Logger.Info("device environment", "name", k, "value", dev[k])
	}
	if len(dev) == 0 {
		cfg.Logger.Info("no device environment: was the pod allocated a device?", "prefixes", cfg.Prefixes)
		if cfg.Once {
			return errors.New("no device environment")
		}
	}
	if cfg.Once {
		return nil
	}
	host, _ := os.Hostname()
	body, err := json.Marshal(Reply{Hostname: host, Device: dev})
	if err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(body)
	})
	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(lis) }()
	cfg.Logger.Info("serving device environment", "address", lis.Addr().String())
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	case err := <-errc:
		if errors.Is(err, http.ErrServerClosed) {
			return nil
		}
		return err
	}
}
