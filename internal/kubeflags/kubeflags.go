// Package kubeflags is what the command lines of Dowse's components with a
// Kubernetes client (dowse-agent, dowse-controller) share: the client's
// kubeconfig and rate limits (Client), the metrics, health and profiling
// addresses (Serving), zap's logging flags, defaults from the environment
// (EnvOr), flag values (lists, float32, and durations and counts whose 0
// means none), and Main, which runs a component
// as its binary does. The components' Configs hold a Client and a Serving,
// so a test sets the very fields the flags set. It links client-go and
// controller-runtime: discovery handlers and mappers do not import it.
package kubeflags

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/dowse-dev/dowse/internal/command"
	"github.com/dowse-dev/dowse/internal/version"
)

// Client says how to reach the API server.
type Client struct {
	// Kubeconfig is a kubeconfig path; empty means in-cluster.
	Kubeconfig string
	// QPS and Burst are the client's rate limits (the component's defaults
	// when 0; a negative QPS turns client-go's limiter off).
	QPS   float32
	Burst int
}

// AddFlags registers --kubeconfig, --kube-api-qps and --kube-api-burst on
// fs, with c's values as their defaults.
func (c *Client) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "path to a kubeconfig; empty means in-cluster")
	fs.Var(Float32(&c.QPS), "kube-api-qps", "API client `requests` per second")
	fs.IntVar(&c.Burst, "kube-api-burst", c.Burst, "API client burst")
}

// Load is a copy of override when it is set (tests pass their API
// server's), else the kubeconfig's or the in-cluster configuration, with
// c's rate limits (when set) and userAgent.
func (c Client) Load(override *rest.Config, userAgent string) (*rest.Config, error) {
	cfg := override
	if cfg == nil {
		var err error
		if c.Kubeconfig != "" {
			cfg, err = clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
		} else {
			cfg, err = rest.InClusterConfig()
		}
		if err != nil {
			return nil, fmt.Errorf("loading kubeconfig: %w", err)
		}
	}
	cfg = rest.CopyConfig(cfg)
	if c.QPS != 0 {
		cfg.QPS, cfg.Burst = c.QPS, c.Burst
	}
	cfg.UserAgent = userAgent
	return cfg, nil
}

// Serving holds a component's listen addresses: "0" disables one, and an
// empty one takes the component's default (none for PprofAddr).
type Serving struct {
	MetricsAddr, HealthAddr string
	PprofAddr               string
}

// Off is a Serving that serves nothing, for tests that run several
// components in one process.
func Off() Serving { return Serving{MetricsAddr: "0", HealthAddr: "0", PprofAddr: "0"} }

// SetDefaults fills empty addresses: metrics and health with the
// component's, profiling with "0".
func (s *Serving) SetDefaults(metrics, health string) {
	if s.MetricsAddr == "" {
		s.MetricsAddr = metrics
	}
	if s.HealthAddr == "" {
		s.HealthAddr = health
	}
	if s.PprofAddr == "" {
		s.PprofAddr = "0"
	}
}

// AddFlags registers --metrics-bind-address, --health-probe-bind-address
// and --pprof-bind-address on fs, with s's values as their defaults.
func (s *Serving) AddFlags(fs *flag.FlagSet) {
	fs.StringVar(&s.MetricsAddr, "metrics-bind-address", s.MetricsAddr, "Prometheus metrics address (0 disables)")
	fs.StringVar(&s.HealthAddr, "health-probe-bind-address", s.HealthAddr, "health probe address (0 disables)")
	fs.StringVar(&s.PprofAddr, "pprof-bind-address", s.PprofAddr, "Go profiling address (0 disables)")
}

// EnvOr is the environment variable key, or def when it is unset or empty.
func EnvOr(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

// Float32 is a flag.Value setting *p.
func Float32(p *float32) flag.Value { return (*float32Value)(p) }

type float32Value float32

func (f *float32Value) String() string {
	if f == nil {
		return "0"
	}
	return strconv.FormatFloat(float64(*f), 'g', -1, 32)
}

func (f *float32Value) Set(s string) error {
	v, err := strconv.ParseFloat(s, 32)
	if err != nil {
		return err
	}
	*f = float32Value(v)
	return nil
}

// DurationOrNone is a flag.Value setting *p, where 0 on the command line
// means none: it is stored as -1, since a zero field of the Configs takes
// the default.
func DurationOrNone(p *time.Duration) flag.Value { return (*durationOrNone)(p) }

type durationOrNone time.Duration

func (d *durationOrNone) String() string {
	if d == nil || *d < 0 {
		return "0s"
	}
	return time.Duration(*d).String()
}

func (d *durationOrNone) Set(s string) error {
	v, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	*d = durationOrNone(orNone(v))
	return nil
}

// IntOrNone is DurationOrNone for an int.
func IntOrNone(p *int) flag.Value { return (*intOrNone)(p) }

type intOrNone int

func (n *intOrNone) String() string {
	if n == nil || *n < 0 {
		return "0"
	}
	return strconv.Itoa(int(*n))
}

func (n *intOrNone) Set(s string) error {
	v, err := strconv.Atoi(s)
	if err != nil {
		return err
	}
	*n = intOrNone(orNone(v))
	return nil
}

func orNone[T int | time.Duration](v T) T {
	if v == 0 {
		return -1
	}
	return v
}

// List is a flag.Value setting *p from comma-separated items, spaces
// around them trimmed and empty ones dropped ("" sets none).
func List(p *[]string) flag.Value { return (*listValue)(p) }

type listValue []string

func (l *listValue) String() string {
	if l == nil {
		return ""
	}
	return strings.Join(*l, ",")
}

func (l *listValue) Set(s string) error {
	var items []string
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			items = append(items, item)
		}
	}
	*l = items
	return nil
}

// Main runs a component as its binary: it sets the garbage collector's
// percentage (unless GOGC is set; 0 leaves Go's), registers addFlags' flags
// and zap's and --version on a flag set of the binary's own
// (controller-runtime registers --kubeconfig on flag.CommandLine in an init
// function), parses the command line, and calls run with a context that
// ends at SIGINT or SIGTERM and a zap logger (also controller-runtime's).
// It exits 1 when run fails.
func Main(name string, gcPercent int, addFlags func(*flag.FlagSet), run func(ctx context.Context, log logr.Logger) error) {
	command.TuneGC(gcPercent)
	fs := flag.NewFlagSet(name, flag.ExitOnError)
	addFlags(fs)
	zapOpts := zap.Options{}
	zapOpts.BindFlags(fs)
	showVersion := version.Flag(fs, name)
	_ = fs.Parse(os.Args[1:])
	if showVersion.Print(os.Stdout) {
		return
	}
	log := zap.New(zap.UseFlagOptions(&zapOpts))
	ctrl.SetLogger(log)
	ctx, stop := command.SignalContext()
	defer stop()
	if err := run(ctx, log); err != nil {
		fmt.Fprintln(os.Stderr, name+":", err)
		stop()
		os.Exit(1)
	}
}
