package handler

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"

	"github.com/go-logr/logr"

	"github.com/dowse-dev/dowse/internal/command"
	"github.com/dowse-dev/dowse/internal/nodepaths"
	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
)

const (
	// DefaultStateDir is the agent's state directory on a node.
	DefaultStateDir = nodepaths.DefaultStateDir
	// StateDirEnv names the environment variable that overrides
	// DefaultStateDir when --state-dir is not given.
	StateDirEnv = nodepaths.StateDirEnv
	// AkriStateDirEnv is Akri's name for the folder of the registration
	// and handler sockets, honoured after StateDirEnv so that a handler
	// deployed with Akri's pod spec finds the agent.
	AkriStateDirEnv = nodepaths.AkriStateDirEnv
	// RegistrationSocketName is the agent's registration socket, relative to
	// the state directory.
	RegistrationSocketName = nodepaths.RegistrationSocket

	defaultRetryInitial    = 200 * time.Millisecond
	defaultRetryMax        = 30 * time.Second
	defaultRegisterTimeout = 5 * time.Second
	defaultShutdownTimeout = 5 * time.Second

	// maxSocketPath is the room in sockaddr_un.sun_path on Linux (108 bytes)
	// minus its terminating NUL. A longer path fails at bind time with a bare
	// EINVAL, so NewServer checks it and says which path is at fault.
	maxSocketPath = 107
)

// Discoverer is the one thing a protocol implements.
type Discoverer interface {
	// Discover serves one Discover stream, that is one Configuration.
	//
	// It first validates req. When discovery_details or discovery_properties
	// cannot be parsed or are invalid it returns an error made with
	// status.Error(codes.InvalidArgument, ...) whose message names the bad
	// field; the agent shows it in the Configuration's status and does not
	// retry until the Configuration changes.
	//
	// It then calls send with the complete current device list (an empty list
	// means "no devices"), and again whenever that list changes, until ctx
	// ends; it returns nil then. send drops a list identical to the previous
	// one (in any order), so a Discoverer that polls may simply send what it
	// found each round. send does not keep devs, so the caller may reuse
	// them. send returns an error when the stream is broken or when the list
	// breaks the protocol (an empty or repeated id); Discover should return
	// that error.
	//
	// ctx carries the logger (logr.FromContextOrDiscard) and ends when the
	// agent cancels the stream or the handler shuts down. Any other error is
	// reported to the agent, which retries with backoff.
	Discover(ctx context.Context, req *discoveryv1.DiscoverRequest, send func([]*discoveryv1.Device) error) error
}

// Announcer is implemented by a Discoverer with something to say once
// when its Server starts, beside the Server's own start line: what it
// follows, say (udev: the udev daemon's events or the kernel's).
type Announcer interface {
	Announce(log logr.Logger)
}

// Config is what a Server needs. Name, StateDir and Discoverer are required;
// the zero value of every other field is a sane default.
type Config struct {
	// Name is the handler name that Configurations use in
	// spec.discoveryHandler.name, a DNS-1123 label such as "debug-echo".
	Name string
	// MetricsAddr is the TCP address the Server serves Prometheus metrics on
	// at /metrics (streams, lists sent, errors, registrations), e.g. ":9460";
	// empty: not served. A failure to listen is logged, never fatal.
	MetricsAddr string
	// Shared is true when the devices this handler finds can be seen from
	// several nodes (network devices), false for devices attached to the node.
	Shared bool
	// StateDir is the agent's state directory; SocketDir defaults to its
	// discovery folder.
	StateDir string
	// SocketDir is the folder of the agent's registration socket
	// (<SocketDir>/registration.sock), where the handler's own socket goes
	// too (<SocketDir>/<Name>-<pid>.sock): <StateDir>/discovery unless
	// given (Akri's DISCOVERY_HANDLERS_DIRECTORY names it directly). It is
	// all of the node a handler's container needs to mount.
	SocketDir string
	// Discoverer serves the Discover streams.
	Discoverer Discoverer
	// Logger receives the SDK's logs and is put in each stream's context.
	Logger logr.Logger

	// RetryInitial and RetryMax bound the exponential backoff between
	// registration attempts while the agent is absent or unavailable.
	// Defaults: 200ms and 30s.
	RetryInitial time.Duration
	RetryMax     time.Duration
	// RegisterTimeout bounds one registration call. Default: 5s.
	RegisterTimeout time.Duration
	// ShutdownTimeout bounds how long Start waits for open streams to finish
	// once its context ends before it closes them hard. Default: 5s.
	ShutdownTimeout time.Duration
}

// dns1123Label is the same rule Kubernetes applies to names; the agent
// rejects any other handler name.
var dns1123Label = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)

// validateAndDefault checks cfg, fills in defaults and returns the absolute
// path of the handler's socket.
func (cfg *Config) validateAndDefault() (string, error) {
	var errs []error
	if len(cfg.Name) > 63 || !dns1123Label.MatchString(cfg.Name) {
		errs = append(errs, fmt.Errorf("name %q is not a DNS-1123 label (lower-case alphanumerics and '-', at most 63 characters)", cfg.Name))
	}
	if cfg.Discoverer == nil {
		errs = append(errs, errors.New("discoverer is required"))
	}
	if cfg.StateDir == "" && cfg.SocketDir == "" {
		errs = append(errs, errors.New("state directory (or socket directory) is required"))
	}
	if cfg.RetryInitial < 0 || cfg.RetryMax < 0 || cfg.RegisterTimeout < 0 || cfg.ShutdownTimeout < 0 {
		errs = append(errs, errors.New("durations must not be negative"))
	}
	if len(errs) > 0 {
		return "", errors.Join(errs...)
	}

	if cfg.RetryInitial == 0 {
		cfg.RetryInitial = defaultRetryInitial
	}
	if cfg.RetryMax == 0 {
		cfg.RetryMax = defaultRetryMax
	}
	if cfg.RetryMax < cfg.RetryInitial {
		cfg.RetryMax = cfg.RetryInitial
	}
	if cfg.RegisterTimeout == 0 {
		cfg.RegisterTimeout = defaultRegisterTimeout
	}
	if cfg.ShutdownTimeout == 0 {
		cfg.ShutdownTimeout = defaultShutdownTimeout
	}

	// The agent accepts only an absolute UDS endpoint inside its state
	// directory, so the directory is made absolute before anything is built
	// from it.
	if cfg.SocketDir == "" {
		cfg.SocketDir = nodepaths.DiscoveryDir(cfg.StateDir)
	}
	dir, err := filepath.Abs(cfg.SocketDir)
	if err != nil {
		return "", fmt.Errorf("socket directory %q: %w", cfg.SocketDir, err)
	}
	cfg.SocketDir = dir

	// The pid keeps two handlers of the same name apart on a shared state
	// directory, and keeps the path stable for the life of the process. A
	// file left by an earlier process with the same pid (pid 1 in a
	// container) is stale by then and Start replaces it.
	sock := filepath.Join(dir, cfg.Name+"-"+strconv.Itoa(os.Getpid())+".sock")
	for _, p := range []string{sock, filepath.Join(dir, RegistrationSocketName)} {
		if len(p) > maxSocketPath {
			return "", fmt.Errorf("socket path %q is %d bytes, longer than the %d a Unix socket allows: use a shorter state directory", p, len(p), maxSocketPath)
		}
	}
	return sock, nil
}

// StateDirFromEnv resolves the state directory the way every handler binary
// does: the --state-dir flag when given, else $DOWSE_STATE_DIR, else
// Akri's $DISCOVERY_HANDLERS_DIRECTORY, else /var/lib/dowse.
func StateDirFromEnv(flagValue string) string {
	return nodepaths.StateDir(flagValue)
}

// StateDirFlag registers --state-dir on fs. Its default is
// StateDirFromEnv(""), read when StateDirFlag is called, so --help shows the
// directory the handler would really use and the flag still wins over the
// environment.
func StateDirFlag(fs *flag.FlagSet) *string {
	return command.StateDirFlag(fs, "the registration socket and handler sockets")
}
