// Package console is `dowsectl console`: a web page served on loopback that
// shows Configurations with each node's state and their Instances, Devices
// with their twins (live values, from the controller's readings API when
// the API server serves it, else from Device.status; a small plot of
// numeric ones, a form for desired values) and the Events of the object in view. It talks to the API
// server with the user's own credentials, as kubectl proxy does: nothing is
// installed in the cluster, and the page can do what the user may do and
// no more. Because it acts as the user, every path needs a secret that other
// local users and processes cannot read: the address printed at start holds
// a one-time login, traded on first use for an HttpOnly, SameSite=Strict
// cookie, and the listener stays on loopback unless asked otherwise. The page's assets are embedded (no internet needed); live
// updates come from informers (package live) as server-sent events.
package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/dowsectl/live"
	readingsv1 "github.com/dowse-dev/dowse/shared/api/readings/v1alpha1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

//go:embed assets
var assets embed.FS

// DefaultListen is where the console listens unless told otherwise.
const DefaultListen = "127.0.0.1:8470"

// Config is what the console needs; Listen, Namespace and Heartbeat have
// defaults.
type Config struct {
	// Listen is the address to serve on; DefaultListen when empty. Other
	// processes of this machine can reach it, so every request needs the
	// session cookie traded for the one-time login in URL, the page refuses
	// requests for other host names (DNS rebinding) and writes without the
	// page's token.
	Listen string
	// AllowRemote lets Listen be an address other than loopback: anyone who
	// can reach it and obtains the login then acts with the user's
	// credentials, so New refuses such an address without it.
	AllowRemote bool
	// Namespace is shown first; the page may switch. "" shows all
	// namespaces.
	Namespace string
	// Dynamic reads and watches, as the user.
	Dynamic dynamic.Interface
	// SetDesired writes a desired value after checking it against the
	// model: the function `dowsectl twin set` uses, so both refuse alike.
	SetDesired func(ctx context.Context, key client.ObjectKey, property, value string) error
	// Context and Server name the kubeconfig context and API server in the
	// page's header.
	Context, Server string
	// Heartbeat is how often an idle event stream sends a comment, so that
	// a dead client is noticed; 15 s when zero.
	Heartbeat time.Duration
	// Readings says whether the API server serves the live readings API
	// (readings.dowse.dev; live.ReadingsServed), asked each time a page
	// opens its stream. When it does, the stream also watches the
	// namespace's DeviceReadings and the page shows each reported value
	// from there when it is newer than Device.status (which the controller
	// writes under a budget); otherwise the page shows Device.status. Nil:
	// never asked, Device.status only.
	Readings func(context.Context) bool
}

// Server is a running console.
type Server struct {
	cfg    Config
	token  string
	ln     net.Listener
	static fs.FS
	// login is the one-time secret in URL; spent once it was traded for
	// the session cookie, whose value is session.
	login, session string
	spent          atomic.Bool
	// cookie names the session cookie: a browser keeps cookies per host,
	// not per port, so two consoles on one machine need names of their own.
	cookie string
}

// New listens on cfg.Listen. Start serves.
func New(cfg Config) (*Server, error) {
	if cfg.Dynamic == nil || cfg.SetDesired == nil {
		return nil, errors.New("console: Dynamic and SetDesired are required")
	}
	if cfg.Listen == "" {
		cfg.Listen = DefaultListen
	}
	if cfg.Heartbeat == 0 {
		cfg.Heartbeat = 15 * time.Second
	}
	if !cfg.AllowRemote {
		if err := loopbackOnly(cfg.Listen); err != nil {
			return nil, err
		}
	}
	var secrets [3]string
	for i := range secrets {
		b := make([]byte, 16)
		if _, err := rand.Read(b); err != nil {
			return nil, err
		}
		secrets[i] = hex.EncodeToString(b)
	}
	static, err := fs.Sub(assets, "assets")
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return &Server{cfg: cfg, token: secrets[0], login: secrets[1], session: secrets[2], ln: ln, static: static, cookie: "dowse_console_" + port}, nil
}

// loopbackOnly refuses a listen address whose host is not a loopback IP or
// localhost (an empty host listens on every interface).
func loopbackOnly(listen string) error {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("console: listen address %q: %w", listen, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("console: %q is not a loopback address: whoever reaches the page acts with your credentials; allow it explicitly (--allow-remote) to serve there anyway", listen)
}

// URL is the page's address with its one-time login: the first request
// with it gets the session cookie; afterwards it is refused.
func (s *Server) URL() string { return s.Address() + "?login=" + s.login }

// Address is the page's address without the login.
func (s *Server) Address() string { return "http://" + s.ln.Addr().String() + "/" }

// Start serves until ctx ends.
func (s *Server) Start(ctx context.Context) error {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", s.index)
	mux.Handle("GET /assets/", http.StripPrefix("/assets/", http.FileServerFS(s.static)))
	mux.HandleFunc("GET /api/watch", s.watch)
	mux.HandleFunc("GET /api/events", s.events)
	mux.HandleFunc("POST /api/desired", s.desired)
	srv := &http.Server{Handler: s.checkHost(s.authenticate(mux)), ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(s.ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// ctx is done: the shutdown gets a few seconds of its own.
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// checkHost refuses requests whose Host is not this loopback listener's
// (a page elsewhere that rebinds its DNS name to 127.0.0.1).
func (s *Server) checkHost(next http.Handler) http.Handler {
	_, port, _ := net.SplitHostPort(s.ln.Addr().String())
	allowed := map[string]bool{s.ln.Addr().String(): true, "localhost:" + port: true, "127.0.0.1:" + port: true, "[::1]:" + port: true}
	if host, _, _ := net.SplitHostPort(s.cfg.Listen); host != "" {
		allowed[net.JoinHostPort(host, port)] = true
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !allowed[r.Host] {
			http.Error(w, "this console answers only to "+s.ln.Addr().String(), http.StatusForbidden)
			return
		}
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("X-Frame-Options", "DENY")
		w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; img-src 'self' data:; frame-ancestors 'none'")
		next.ServeHTTP(w, r)
	})
}

// authenticate lets through requests that carry the session cookie, trades
// the one-time login for it (once), and refuses everything else.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, err := r.Cookie(s.cookie); err == nil && subtle.ConstantTimeCompare([]byte(c.Value), []byte(s.session)) == 1 {
			next.ServeHTTP(w, r)
			return
		}
		if login := r.URL.Query().Get("login"); r.Method == http.MethodGet && r.URL.Path == "/" && login != "" &&
			subtle.ConstantTimeCompare([]byte(login), []byte(s.login)) == 1 && s.spent.CompareAndSwap(false, true) {
			http.SetCookie(w, &http.Cookie{Name: s.cookie, Value: s.session, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
			// Off the address bar and the history, now that it is spent.
			http.Redirect(w, r, "/", http.StatusSeeOther)
			return
		}
		w.Header().Set("Cache-Control", "no-store")
		http.Error(w, "this console needs its login: open the address `dowsectl console` printed, in one browser (the login works once; restart dowsectl console for a new one)", http.StatusUnauthorized)
	})
}

func (s *Server) index(w http.ResponseWriter, _ *http.Request) {
	b, err := fs.ReadFile(s.static, "index.html")
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	page := strings.NewReplacer("{{TOKEN}}", s.token, "{{NAMESPACE}}", attr(s.cfg.Namespace),
		"{{CONTEXT}}", attr(s.cfg.Context), "{{SERVER}}", attr(s.cfg.Server)).Replace(string(b))
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = io.WriteString(w, page)
}

// attr escapes s for an HTML attribute value.
func attr(s string) string {
	return strings.NewReplacer("&", "&amp;", `"`, "&quot;", "<", "&lt;", ">", "&gt;", "'", "&#39;").Replace(s)
}

// kinds are what the main stream watches, with the words its errors use.
var kinds = []struct {
	kind, plural, words string
}{
	{"Configuration", "configurations", "Configurations"},
	{"Instance", "instances", "Instances"},
	{"DeviceModel", "devicemodels", "DeviceModels"},
	{"Device", "devices", "Devices"},
}

// sse writes server-sent events to one client.
type sse struct {
	mu sync.Mutex
	w  http.ResponseWriter
	f  http.Flusher
}

func newSSE(w http.ResponseWriter) (*sse, bool) {
	f, ok := w.(http.Flusher)
	if !ok {
		return nil, false
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	// The browser reconnects this soon after the stream breaks.
	_, _ = io.WriteString(w, "retry: 2000\n\n")
	f.Flush()
	return &sse{w: w, f: f}, true
}

func (e *sse) send(event string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	fmt.Fprintf(e.w, "event: %s\ndata: %s\n\n", event, b)
	e.f.Flush()
}

func (e *sse) comment() {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, _ = io.WriteString(e.w, ": keep-alive\n\n")
	e.f.Flush()
}

// message is one event of a stream: an object added or changed (upsert),
// gone (delete), the first complete list (synced), the watch's health
// (state: problem in words, "" when it is fine again), or, first on the
// main stream, where reported values come from (source: Source is
// readingsv1.SourceLive when the DeviceReadings are watched too,
// readingsv1.SourceStatus when only Device.status is).
type message struct {
	Kind    string         `json:"kind"`
	Op      string         `json:"op"`
	Object  map[string]any `json:"object,omitempty"`
	Problem string         `json:"problem,omitempty"`
	Source  string         `json:"source,omitempty"`
}

// readingKind is the stream's kind for DeviceReadings.
const readingKind = "DeviceReading"

func slim(u *unstructured.Unstructured) map[string]any {
	o := u.DeepCopy()
	unstructured.RemoveNestedField(o.Object, "metadata", "managedFields")
	unstructured.RemoveNestedField(o.Object, "metadata", "annotations", "kubectl.kubernetes.io/last-applied-configuration")
	return o.Object
}

// stream sends first, then runs watches for one client until it goes
// away.
func (s *Server) stream(w http.ResponseWriter, r *http.Request, watches map[string]live.Watch, words map[string]string, ns string, first ...message) {
	out, ok := newSSE(w)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	for _, m := range first {
		out.send("object", m)
	}
	ctx := r.Context()
	var wg sync.WaitGroup
	for kind, lw := range watches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lw.Run(ctx, live.Handler{
				Upsert: func(u *unstructured.Unstructured) {
					out.send("object", message{Kind: kind, Op: "upsert", Object: slim(u)})
				},
				Delete: func(u *unstructured.Unstructured) {
					out.send("object", message{Kind: kind, Op: "delete", Object: slim(u)})
				},
				Synced: func() { out.send("object", message{Kind: kind, Op: "synced"}) },
				State: func(err error) {
					m := message{Kind: kind, Op: "state"}
					if err != nil {
						m.Problem = live.Describe(err, words[kind], ns)
					}
					out.send("object", m)
				},
			})
		}()
	}
	t := time.NewTicker(s.cfg.Heartbeat)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			wg.Wait()
			return
		case <-t.C:
			out.comment()
		}
	}
}

// watch streams the namespace's Configurations, Instances, DeviceModels and
// Devices (?namespace=NS; ?all=1 for every namespace), and its
// DeviceReadings when the API server serves them, after a message saying
// which source the reported values have.
func (s *Server) watch(w http.ResponseWriter, r *http.Request) {
	ns := r.URL.Query().Get("namespace")
	if r.URL.Query().Get("all") == "1" {
		ns = ""
	}
	watches := map[string]live.Watch{}
	words := map[string]string{}
	for _, k := range kinds {
		watches[k.kind] = live.Watch{Client: s.cfg.Dynamic, Resource: v1alpha1.GroupVersion.WithResource(k.plural), Namespace: ns}
		words[k.kind] = k.words
	}
	source := message{Kind: readingKind, Op: "source", Source: readingsv1.SourceStatus}
	if s.cfg.Readings != nil && s.cfg.Readings(r.Context()) {
		watches[readingKind] = live.Watch{Client: s.cfg.Dynamic, Resource: readingsv1.GVR(), Namespace: ns}
		words[readingKind] = "DeviceReadings"
		source.Source = readingsv1.SourceLive
	}
	s.stream(w, r, watches, words, ns, source)
}

// events streams the Events of one object (?namespace, kind, name).
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	ns, kind, name := q.Get("namespace"), q.Get("kind"), q.Get("name")
	if ns == "" || kind == "" || name == "" {
		http.Error(w, "namespace, kind and name are required", http.StatusBadRequest)
		return
	}
	sel := fields.Set{"involvedObject.kind": kind, "involvedObject.name": name}.AsSelector().String()
	s.stream(w, r, map[string]live.Watch{"Event": {Client: s.cfg.Dynamic, Resource: schema.GroupVersionResource{Version: "v1", Resource: "events"}, Namespace: ns, FieldSelector: sel}},
		map[string]string{"Event": "Events"}, ns)
}

// desiredRequest is the form's body.
type desiredRequest struct {
	Namespace string `json:"namespace"`
	Device    string `json:"device"`
	Property  string `json:"property"`
	Value     string `json:"value"`
}

// desired sets a desired value through the same check as `twin set`; the
// answer is {"error": "..."} in words when it is refused.
func (s *Server) desired(w http.ResponseWriter, r *http.Request) {
	if subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Dowse-Token")), []byte(s.token)) != 1 {
		writeJSON(w, http.StatusForbidden, map[string]string{"error": "this request did not come from the console's page (missing or wrong token): reload the page"})
		return
	}
	var req desiredRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10)).Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "bad request: " + err.Error()})
		return
	}
	if req.Namespace == "" || req.Device == "" || req.Property == "" {
		writeJSON(w, http.StatusBadRequest, map[string]string{"error": "namespace, device and property are required"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	if err := s.cfg.SetDesired(ctx, client.ObjectKey{Namespace: req.Namespace, Name: req.Device}, req.Property, req.Value); err != nil {
		writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"error": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"set": req.Property + "=" + req.Value})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
