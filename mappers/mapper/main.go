package mapper

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/dowse-dev/dowse/internal/command"
	"github.com/dowse-dev/dowse/internal/nodepaths"
	"github.com/dowse-dev/dowse/internal/version"
)

// DefaultMemoryLimit is the Go runtime's soft memory limit in mapper
// binaries (--memory-limit) unless GOMEMLIMIT is set.
const DefaultMemoryLimit = 8 << 20

// DefaultSinkMemoryLimit is the soft memory limit while a pushMethod sink
// runs (--sink-memory-limit). Readings pushed at their rate are garbage at
// that rate, and the limit counts the runtime's own memory besides the
// heap: at 8 MiB a mapper pushing 10,000 readings a second collected its
// heap of a few MiB hundreds of times a second.
const DefaultSinkMemoryLimit = 12 << 20

// NameEnv names the environment variable that sets a mapper's registration
// name when --name is not given; the controller sets it in the mapper Pods
// it runs.
const NameEnv = nodepaths.MapperNameEnv

// DefaultMaxProcs is the Go runtime's GOMAXPROCS in mapper binaries
// (--max-procs) unless GOMAXPROCS is set. A mapper waits on devices far
// more than it computes: with one P, 100 Modbus devices at 1 s cycles cost
// half the CPU (no idle Ps spinning for work at every wake-up) and about
// 1 MiB less memory, and one P still serves above 10,000 reads a second.
const DefaultMaxProcs = 1

const memoryLimitUsage = "soft limit of the Go runtime's memory (the collector works harder near it; never a cap that fails allocations), " +
	"in bytes or with a KiB/MiB/GiB suffix; 0 or \"off\" for none; GOMEMLIMIT, when set, wins"

// Version is the mapper's version: internal/version's, stamped at build
// time (-ldflags "-X github.com/dowse-dev/dowse/internal/version.version=v1.2.3"),
// else the main module's, else "dev".
func Version() string { return version.Get() }

// Main is the whole main of a mapper binary: it parses the common flags
// (--name, --state-dir, --dmi-socket, --socket, --metrics-address,
// --memory-limit, --sink-memory-limit, --max-procs, --version), runs the mapper until SIGINT or SIGTERM and
// exits 1 when it fails. Only main should call it.
func Main(protocol string, newDriver NewDriver) {
	command.TuneGC(50)
	cfg := Config{Protocol: protocol, NewDriver: newDriver, Logger: command.NewLogger()}
	fs := flag.NewFlagSet(os.Args[0], flag.ExitOnError)
	name := protocol
	if n := os.Getenv(NameEnv); n != "" {
		name = n // set by the controller in the mapper Pods it runs
	}
	fs.StringVar(&cfg.Name, "name", name, "registration name (env "+NameEnv+"; Devices name it in spec.mapperName; a Configuration's mapper uses the Configuration's name)")
	stateDir := command.StateDirFlag(fs, "the DMI socket and mapper sockets")
	fs.StringVar(&cfg.DMISocket, "dmi-socket", "", "device manager's DMI socket (default <state-dir>/dmi/dmi.sock; KubeEdge edgecore: /etc/kubeedge/dmi.sock)")
	fs.StringVar(&cfg.Socket, "socket", "", "socket this mapper serves DeviceMapperService on (default <state-dir>/dmi/mapper-<name>-<pid>.sock)")
	metricsAddr := fs.String("metrics-address", "", "address to serve Prometheus metrics on at /metrics, e.g. :9471 (off when empty)")
	fs.DurationVar(&cfg.DefaultCollectCycle, "default-collect-cycle", time.Second, "collect cycle of properties without one")
	fs.DurationVar(&cfg.DefaultReportCycle, "default-report-cycle", time.Minute, "heartbeat of properties without a reportCycle: an unchanged value is reported again after this long")
	fs.IntVar(&cfg.UnhealthyAfter, "unhealthy-after", 3, "read rounds in a row that all fail before a device is unhealthy and reconnected")
	fs.IntVar(&cfg.SinkBufferMessages, "sink-buffer-messages", 10000, "readings each pushMethod sink keeps while its peer is down or slow; beyond, the oldest are dropped")
	sinkBytes := fs.String("sink-buffer-bytes", "2MiB", "bytes of readings each pushMethod sink keeps (with a KiB/MiB suffix); beyond, the oldest are dropped")
	sinkDir := os.Getenv(nodepaths.SinkSecretsDirEnv)
	if sinkDir == "" {
		sinkDir = DefaultSinkSecretsDir
	}
	fs.StringVar(&cfg.SinkSecretsDir, "sink-secrets-dir", sinkDir, "where the Pod mounts the Secrets pushMethods name (secretRef): <dir>/<secret>/username, password, ca.crt (env "+nodepaths.SinkSecretsDirEnv+")")
	memLimit := fs.String("memory-limit", FormatBytes(DefaultMemoryLimit), memoryLimitUsage)
	sinkMemLimit := fs.String("sink-memory-limit", FormatBytes(DefaultSinkMemoryLimit),
		"the soft limit while any pushMethod sink runs (as --memory-limit; ignored when GOMEMLIMIT is set)")
	maxProcs := fs.Int("max-procs", DefaultMaxProcs, "Go runtime's GOMAXPROCS: goroutines running Go code at once (0: the runtime's choice, one per core of the CPU limit); GOMAXPROCS, when set, wins")
	showVersion := fs.Bool("version", false, "print the version and exit")
	_ = fs.Parse(os.Args[1:])
	if *showVersion {
		fmt.Printf("dowse-%s-mapper %s\n", protocol, Version())
		return
	}
	if os.Getenv("GOMAXPROCS") == "" && *maxProcs > 0 {
		runtime.GOMAXPROCS(*maxProcs)
	}
	if os.Getenv("GOMEMLIMIT") == "" {
		limit, err := ParseBytes(*memLimit)
		if err != nil {
			fmt.Fprintf(os.Stderr, "--memory-limit: %v\n", err)
			os.Exit(2)
		}
		sinkLimit, err := ParseBytes(*sinkMemLimit)
		if err != nil {
			fmt.Fprintf(os.Stderr, "--sink-memory-limit: %v\n", err)
			os.Exit(2)
		}
		if limit == 0 {
			limit = math.MaxInt64 // the runtime's "no limit"
		}
		if sinkLimit == 0 {
			sinkLimit = math.MaxInt64
		}
		debug.SetMemoryLimit(limit)
		cfg.OnSinks = func(running bool) {
			if running {
				debug.SetMemoryLimit(max(limit, sinkLimit))
			} else {
				debug.SetMemoryLimit(limit)
			}
		}
	}
	cfg.StateDir = *stateDir
	var err error
	if cfg.SinkBufferBytes, err = ParseBytes(*sinkBytes); err != nil || cfg.SinkBufferBytes == 0 {
		fmt.Fprintf(os.Stderr, "--sink-buffer-bytes: %q must be a size above 0\n", *sinkBytes)
		os.Exit(2)
	}

	cfg.Metrics = NewMetrics()

	ctx, stop := command.SignalContext()
	defer stop()
	if *metricsAddr != "" {
		go serveMetrics(ctx, cfg.Logger, *metricsAddr, cfg.Metrics)
	}
	if err := Run(ctx, cfg); err != nil {
		cfg.Logger.Error(err, "mapper failed", "protocol", protocol)
		stop()
		os.Exit(1)
	}
}

// ParseBytes reads a size: bytes, or a number with a B, KiB, MiB or GiB
// suffix (K, M, G, KB, MB, GB are taken as the binary units too); "off" is 0.
func ParseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	if strings.EqualFold(t, "off") || t == "" {
		return 0, nil
	}
	mult := int64(1)
	upper := strings.ToUpper(t)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KIB", 1 << 10}, {"MIB", 1 << 20}, {"GIB", 1 << 30}, {"KB", 1 << 10}, {"MB", 1 << 20}, {"GB", 1 << 30},
		{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"B", 1}} {
		if strings.HasSuffix(upper, u.suffix) {
			t, mult = strings.TrimSpace(t[:len(t)-len(u.suffix)]), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) || f*float64(mult) > math.MaxInt64/2 {
		return 0, fmt.Errorf("%q is not a size (bytes, or a number with KiB, MiB or GiB)", s)
	}
	return int64(f * float64(mult)), nil
}

// FormatBytes writes n as ParseBytes reads it, in MiB or KiB when exact.
func FormatBytes(n int64) string {
	switch {
	case n != 0 && n%(1<<20) == 0:
		return strconv.FormatInt(n>>20, 10) + "MiB"
	case n != 0 && n%(1<<10) == 0:
		return strconv.FormatInt(n>>10, 10) + "KiB"
	}
	return strconv.FormatInt(n, 10)
}

// Run makes a Mapper of cfg and starts it.
func Run(ctx context.Context, cfg Config) error {
	m, err := New(cfg)
	if err != nil {
		return err
	}
	return m.Start(ctx)
}

// serveMetrics serves /metrics until ctx ends; a failure is logged and
// never stops the mapper.
func serveMetrics(ctx context.Context, log logr.Logger, addr string, m *Metrics) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		log.Error(err, "metrics endpoint unavailable; the mapper goes on without it", "address", addr)
		return
	}
	log.Info("serving metrics", "address", lis.Addr().String())
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}()
	if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
		log.Error(err, "metrics endpoint failed; the mapper goes on without it")
	}
}
