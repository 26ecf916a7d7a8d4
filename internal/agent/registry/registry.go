// Package registry keeps the discovery handlers registered with one agent.
package registry

import (
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/dowse-dev/dowse/internal/agent/peercred"
)

// EndpointType says how the agent reaches a handler.
type EndpointType int

const (
	// UDS endpoints are Unix socket paths inside the agent's state directory.
	UDS EndpointType = iota
	// Network endpoints are host:port, or http://host:port as Akri's
	// handlers register them (kept as host:port).
	Network
)

// Protocol is the discovery API version a handler registered with; the agent
// calls Discover with the same version.
type Protocol string

const (
	ProtocolV1 Protocol = "v1"
	// ProtocolV0 is Akri's protocol.
	ProtocolV0 Protocol = "v0"
)

// Handler is one registered discovery handler.
type Handler struct {
	Name         string
	Endpoint     string
	EndpointType EndpointType
	Shared       bool
	Protocol     Protocol
	// Registrant is the process that registered it (the zero Caller: the
	// agent's own, or unknown).
	Registrant peercred.Caller
	// Generation grows on every change of this handler's registration, so a
	// session can tell a re-registration from the one it already used.
	Generation uint64
}

// InvalidError is returned for a registration that can never succeed as it is.
type InvalidError struct{ Reason string }

func (e *InvalidError) Error() string { return e.Reason }

// Registry is safe for concurrent use. Handlers are keyed by name: a second
// registration under the same name replaces the first (a restarted handler
// comes back on a new socket). Registering identical values is a no-op and
// notifies nobody.
type Registry struct {
	stateDir string

	mu       sync.Mutex
	handlers map[string]Handler
	gen      uint64
	watchers map[chan string]struct{}
}

// New makes a Registry that accepts UDS endpoints only inside stateDir.
func New(stateDir string) *Registry {
	abs, err := filepath.Abs(stateDir)
	if err == nil {
		stateDir = abs
	}
	return &Registry{stateDir: filepath.Clean(stateDir), handlers: map[string]Handler{}, watchers: map[chan string]struct{}{}}
}

// Register validates h and stores it. It returns *InvalidError for a bad
// name or endpoint.
func (r *Registry) Register(h Handler) error {
	if err := r.validate(&h); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.handlers[h.Name]; ok {
		h.Generation = old.Generation
		if old == h {
			return nil
		}
	}
	r.gen++
	h.Generation = r.gen
	r.handlers[h.Name] = h
	r.notifyLocked(h.Name)
	return nil
}

// Get returns the handler registered under name.
func (r *Registry) Get(name string) (Handler, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	h, ok := r.handlers[name]
	return h, ok
}

// Watch returns a channel that receives a handler's name each time its
// registration changes, until cancel is called. Slow readers miss
// intermediate names rather than block the registry, so a reader must treat
// a name as "look again", not as an exact event.
func (r *Registry) Watch() (changes <-chan string, cancel func()) {
	ch := make(chan string, 64)
	r.mu.Lock()
	r.watchers[ch] = struct{}{}
	r.mu.Unlock()
	return ch, func() {
		r.mu.Lock()
		delete(r.watchers, ch)
		r.mu.Unlock()
	}
}

func (r *Registry) notifyLocked(name string) {
	for ch := range r.watchers {
		select {
		case ch <- name:
		default:
		}
	}
}

func (r *Registry) validate(h *Handler) error {
	if errs := validation.IsDNS1123Label(h.Name); len(errs) > 0 {
		return &InvalidError{Reason: fmt.Sprintf("handler name %q is not a DNS-1123 label: %s", h.Name, strings.Join(errs, "; "))}
	}
	if h.Protocol == "" {
		h.Protocol = ProtocolV1
	}
	switch h.EndpointType {
	case UDS:
		if !filepath.IsAbs(h.Endpoint) {
			return &InvalidError{Reason: fmt.Sprintf("endpoint %q of handler %q is not an absolute socket path", h.Endpoint, h.Name)}
		}
		clean := filepath.Clean(h.Endpoint)
		// Only sockets inside the state directory: the agent must never be
		// pointed at an arbitrary socket on the node (a container runtime's,
		// say) by whoever can reach the registration socket.
		if !strings.HasPrefix(clean, r.stateDir+string(filepath.Separator)) {
			return &InvalidError{Reason: fmt.Sprintf("endpoint %q of handler %q is outside the agent's state directory %q", h.Endpoint, h.Name, r.stateDir)}
		}
		h.Endpoint = clean
	case Network:
		// Akri's handlers register http://<POD_IP>:<port> (discovery-utils
		// with POD_IP set): the same plaintext gRPC endpoint as host:port.
		if rest, ok := strings.CutPrefix(h.Endpoint, "http://"); ok {
			h.Endpoint = strings.TrimSuffix(rest, "/")
		}
		if strings.Contains(h.Endpoint, "://") {
			return &InvalidError{Reason: fmt.Sprintf("endpoint %q of handler %q: only host:port and http://host:port are served (plaintext gRPC)", h.Endpoint, h.Name)}
		}
		if _, port, err := net.SplitHostPort(h.Endpoint); err != nil || port == "" {
			return &InvalidError{Reason: fmt.Sprintf("endpoint %q of handler %q is not host:port or http://host:port: %v", h.Endpoint, h.Name, err)}
		}
	default:
		return &InvalidError{Reason: fmt.Sprintf("endpoint type %d of handler %q is unknown", h.EndpointType, h.Name)}
	}
	return nil
}
