package readings

import (
	"cmp"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/link/pki"
	rv1 "github.com/dowse-dev/dowse/shared/api/readings/v1alpha1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// Config configures a Server.
type Config struct {
	// Addr is where the API is served (TLS): the APIService's Service
	// reaches it, and so do the other replicas.
	Addr string
	// Replica is this replica's identity (the holder of the sessions it
	// serves).
	Replica string
	// GetCertificate is the serving certificate: valid for the
	// APIService's Service name (<service>.<namespace>.svc) under the CA
	// of the APIService's caBundle, and for the address the other
	// replicas dial under ReplicaCAs.
	GetCertificate func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	// ReplicaCAs verifies the other replicas' certificates (the link
	// CA's), both their client certificates on /peer/ and their serving
	// ones when this replica asks them.
	ReplicaCAs *x509.CertPool
	// ClientCertificate is this replica's certificate when it asks
	// another (pki.IssueReplica's).
	ClientCertificate func(*tls.CertificateRequestInfo) (*tls.Certificate, error)
	// Store holds the readings of the nodes whose sessions this replica
	// holds.
	Store *Store
	// Devices reads Devices (the controller's cache).
	Devices client.Reader
	// Auth authenticates and authorizes the API's users.
	Auth *Auth
	// Holder names the replica holding node's session ("" when none).
	Holder func(ctx context.Context, node string) (string, error)
	// Peers are the other present replicas and where they serve this API
	// (host:port).
	Peers func() map[string]string
	// PeerTimeout bounds a question to another replica (5 s when zero).
	PeerTimeout time.Duration
	// MaxWatch bounds a watch's life (30 min when zero); clients watch
	// again.
	MaxWatch time.Duration
	// BookmarkEvery is how often a watch that allows bookmarks is sent
	// one (1 min when zero).
	BookmarkEvery time.Duration
	// ReplayMargin: a watch from a resourceVersion also replays what the
	// replicas took this long before it (DefaultReplayMargin when zero).
	ReplayMargin time.Duration
	// DeletionWindow is how long deleted Devices are remembered for
	// replays (15 min when zero): a watch from an older resourceVersion
	// is answered 410 Gone.
	DeletionWindow time.Duration
	Registerer     prometheus.Registerer
	Log            logr.Logger
}

// Server serves readings.dowse.dev/v1alpha1.
type Server struct {
	cfg      Config
	deleted  *deletions
	peerHTTP *http.Client
	peerLong *http.Client

	openapi    *openAPIHandler
	requests   *prometheus.CounterVec
	peerErrors *prometheus.CounterVec
	watches    prometheus.Gauge
}

// NewServer checks cfg and makes a Server; Start serves it.
func NewServer(cfg Config) (*Server, error) {
	if cfg.Store == nil || cfg.Devices == nil || cfg.Auth == nil || cfg.Replica == "" {
		return nil, errors.New("readings: the server needs a store, a Device reader, an authenticator and the replica's identity")
	}
	if cfg.PeerTimeout <= 0 {
		cfg.PeerTimeout = 5 * time.Second
	}
	if cfg.MaxWatch <= 0 {
		cfg.MaxWatch = 30 * time.Minute
	}
	if cfg.BookmarkEvery <= 0 {
		cfg.BookmarkEvery = time.Minute
	}
	if cfg.ReplayMargin <= 0 {
		cfg.ReplayMargin = DefaultReplayMargin
	}
	if cfg.DeletionWindow <= 0 {
		cfg.DeletionWindow = 15 * time.Minute
	}
	if cfg.Peers == nil {
		cfg.Peers = func() map[string]string { return nil }
	}
	if cfg.Log.GetSink() == nil {
		cfg.Log = logr.Discard()
	}
	s := &Server{cfg: cfg, deleted: &deletions{window: cfg.DeletionWindow, max: 100_000},
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "readings", Name: "requests_total",
			Help: "Requests to the live readings API, by verb (get, list, watch, peer-list, peer-watch, discovery, openapi) and HTTP code."}, []string{"verb", "code"}),
		peerErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "dowse", Subsystem: "readings", Name: "peer_errors_total",
			Help: "Questions to another replica that failed (its readings are missing from the answer), by kind (list, get, watch)."}, []string{"kind"}),
		watches: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: "dowse", Subsystem: "readings", Name: "watches",
			Help: "Watches of the live readings API open on this replica (clients' and other replicas')."}),
	}
	if r := cfg.Registerer; r != nil {
		r.MustRegister(s.requests, s.peerErrors, s.watches,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "dowse", Subsystem: "readings", Name: "devices",
				Help: "Devices whose live readings this replica holds."}, func() float64 { return float64(cfg.Store.Len()) }))
	}
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: cfg.ReplicaCAs, GetClientCertificate: cfg.ClientCertificate},
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 15 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 8, IdleConnTimeout: time.Minute, ForceAttemptHTTP2: true,
	}
	oa, err := newOpenAPIHandler()
	if err != nil {
		return nil, err
	}
	s.openapi = oa
	s.peerHTTP = &http.Client{Transport: tr, Timeout: cfg.PeerTimeout}
	s.peerLong = &http.Client{Transport: tr}
	return s, nil
}

// Start serves until ctx ends.
func (s *Server) Start(ctx context.Context) error {
	l, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("readings: listening on %s: %w", s.cfg.Addr, err)
	}
	srv := &http.Server{Handler: s, ReadHeaderTimeout: 10 * time.Second,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: s.cfg.GetCertificate,
			// Verified per path: the front proxy's against the requestheader
			// CA, a replica's against the link CA.
			ClientAuth: tls.RequestClientCert},
		BaseContext: func(net.Listener) context.Context { return ctx }}
	errs := make(chan error, 1)
	go func() { errs <- srv.ServeTLS(l, "", "") }()
	s.cfg.Log.Info("serving the live readings API", "address", l.Addr().String())
	select {
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		_ = srv.Close()
		return nil
	case err := <-errs:
		return err
	}
}

const apiPrefix = "/apis/" + rv1.Group + "/" + rv1.Version

// ServeHTTP routes a request.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimSuffix(r.URL.Path, "/")
	switch {
	case path == "/healthz" || path == "/readyz" || path == "/livez":
		_, _ = w.Write([]byte("ok"))
	case strings.HasPrefix(path, "/peer/"):
		s.servePeer(w, r, path)
	case strings.HasPrefix(path, "/openapi/"):
		// Like discovery, for anyone: the aggregator reads it as itself.
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			s.fail(w, "openapi", apierrors.NewMethodNotSupported(rv1.GVR().GroupResource(), r.Method))
			return
		}
		s.requests.WithLabelValues("openapi", "200").Inc()
		s.openapi.ServeHTTP(w, r)
	case path == "/apis":
		s.discovery(w, r, &metav1.APIGroupList{TypeMeta: metav1.TypeMeta{Kind: "APIGroupList", APIVersion: "v1"}, Groups: []metav1.APIGroup{apiGroup()}})
	case path == "/apis/"+rv1.Group:
		g := apiGroup()
		s.discovery(w, r, &g)
	case path == apiPrefix:
		s.discovery(w, r, &metav1.APIResourceList{TypeMeta: metav1.TypeMeta{Kind: "APIResourceList", APIVersion: "v1"},
			GroupVersion: rv1.GroupVersion.String(), APIResources: []metav1.APIResource{{
				Name: rv1.Resource, SingularName: rv1.Singular, Namespaced: true, Kind: rv1.Kind,
				Verbs: []string{"get", "list", "watch"}, ShortNames: []string{rv1.ShortName}, Categories: []string{"dowse"},
			}}})
	case strings.HasPrefix(path, apiPrefix+"/"):
		s.serveResource(w, r, strings.TrimPrefix(path, apiPrefix+"/"))
	default:
		s.fail(w, "unknown", apierrors.NewNotFound(rv1.GroupVersion.WithResource("").GroupResource(), r.URL.Path))
	}
}

func apiGroup() metav1.APIGroup {
	gv := metav1.GroupVersionForDiscovery{GroupVersion: rv1.GroupVersion.String(), Version: rv1.Version}
	return metav1.APIGroup{TypeMeta: metav1.TypeMeta{Kind: "APIGroup", APIVersion: "v1"}, Name: rv1.Group,
		Versions: []metav1.GroupVersionForDiscovery{gv}, PreferredVersion: gv}
}

// discovery answers anyone: it says only what the API is.
func (s *Server) discovery(w http.ResponseWriter, r *http.Request, v any) {
	if r.Method != http.MethodGet {
		s.fail(w, "discovery", apierrors.NewMethodNotSupported(rv1.GVR().GroupResource(), r.Method))
		return
	}
	s.requests.WithLabelValues("discovery", "200").Inc()
	writeJSON(w, http.StatusOK, v)
}

// request is a parsed request for DeviceReadings.
type request struct {
	verb      string // get, list or watch
	namespace string
	name      string
	labels    labels.Selector
	table     bool
	// initial: a watch starts with every matching reading (no
	// resourceVersion, or "0", or sendInitialEvents); bookmark: then a
	// BOOKMARK saying the initial events ended (sendInitialEvents, as
	// client-go's watch-list asks).
	initial, bookmark bool
	// from: a watch from this resourceVersion replays what came after
	// it (when not initial).
	from int64
	// bookmarks: the client takes BOOKMARK events (allowWatchBookmarks).
	bookmarks bool
	timeout   time.Duration
}

func (s *Server) parse(r *http.Request, rest string) (*request, error) {
	if r.Method != http.MethodGet {
		return nil, apierrors.NewMethodNotSupported(rv1.GVR().GroupResource(), strings.ToLower(r.Method))
	}
	q := r.URL.Query()
	req := &request{labels: labels.Everything(), table: strings.Contains(r.Header.Get("Accept"), "as=Table")}
	parts := strings.Split(rest, "/")
	switch {
	case len(parts) == 1 && parts[0] == rv1.Resource:
	case len(parts) == 3 && parts[0] == "namespaces" && parts[2] == rv1.Resource:
		req.namespace = parts[1]
	case len(parts) == 4 && parts[0] == "namespaces" && parts[2] == rv1.Resource:
		req.namespace, req.name = parts[1], parts[3]
	default:
		return nil, apierrors.NewNotFound(rv1.GVR().GroupResource(), rest)
	}
	watch := q.Get("watch") == "true" || q.Get("watch") == "1"
	switch {
	case watch:
		req.verb = "watch"
	case req.name != "":
		req.verb = "get"
	default:
		req.verb = "list"
	}
	if fs := q.Get("fieldSelector"); fs != "" {
		sel, err := fields.ParseSelector(fs)
		if err != nil {
			return nil, apierrors.NewBadRequest(err.Error())
		}
		for _, rq := range sel.Requirements() {
			if rq.Operator != "=" && rq.Operator != "==" {
				return nil, apierrors.NewBadRequest("only metadata.name and metadata.namespace equality field selectors are served")
			}
			switch rq.Field {
			case "metadata.name":
				if req.name != "" && req.name != rq.Value {
					return nil, apierrors.NewBadRequest("the field selector's name differs from the path's")
				}
				req.name = rq.Value
			case "metadata.namespace":
				if req.namespace != "" && req.namespace != rq.Value {
					return nil, apierrors.NewBadRequest("the field selector's namespace differs from the path's")
				}
				req.namespace = rq.Value
			default:
				return nil, apierrors.NewBadRequest(fmt.Sprintf("field selector %q is not served: only metadata.name and metadata.namespace are", rq.Field))
			}
		}
	}
	if ls := q.Get("labelSelector"); ls != "" {
		sel, err := labels.Parse(ls)
		if err != nil {
			return nil, apierrors.NewBadRequest(err.Error())
		}
		req.labels = sel
	}
	rv := q.Get("resourceVersion")
	req.bookmark = q.Get("sendInitialEvents") == "true"
	req.initial = rv == "" || rv == "0" || req.bookmark
	req.bookmarks = q.Get("allowWatchBookmarks") == "true"
	if watch && !req.initial {
		n, err := parseVersion(rv)
		if err != nil {
			return nil, err
		}
		req.from = n
	}
	if t := q.Get("timeoutSeconds"); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil || n < 0 {
			return nil, apierrors.NewBadRequest("timeoutSeconds must be a number of seconds")
		}
		req.timeout = time.Duration(n) * time.Second
	}
	if req.timeout <= 0 || req.timeout > s.cfg.MaxWatch {
		req.timeout = s.cfg.MaxWatch
	}
	return req, nil
}

func (s *Server) serveResource(w http.ResponseWriter, r *http.Request, rest string) {
	req, err := s.parse(r, rest)
	if err != nil {
		s.fail(w, "unknown", err)
		return
	}
	u, err := s.cfg.Auth.Authenticate(r)
	if err != nil {
		if errors.Is(err, errUnauthenticated) {
			s.fail(w, req.verb, apierrors.NewUnauthorized("the readings API takes the API server's front proxy or a bearer token"))
		} else {
			s.fail(w, req.verb, apierrors.NewInternalError(err))
		}
		return
	}
	allowed, reason, err := s.cfg.Auth.Authorize(r.Context(), u, Attributes{Verb: req.verb, Namespace: req.namespace, Name: req.name})
	if err != nil {
		s.fail(w, req.verb, apierrors.NewInternalError(err))
		return
	}
	if !allowed {
		msg := fmt.Sprintf("User %q cannot %s resource %q in API group %q", u.Name, req.verb, rv1.Resource, rv1.Group)
		if req.namespace != "" {
			msg += fmt.Sprintf(" in the namespace %q", req.namespace)
		}
		if reason != "" {
			msg += ": " + reason
		}
		s.fail(w, req.verb, apierrors.NewForbidden(rv1.GVR().GroupResource(), req.name, errors.New(msg)))
		return
	}
	switch req.verb {
	case "get":
		s.get(w, r, req)
	case "list":
		s.list(w, r, req)
	case "watch":
		s.watch(w, r, req)
	}
}

func (s *Server) get(w http.ResponseWriter, r *http.Request, req *request) {
	ctx := r.Context()
	var d v1alpha1.Device
	if err := s.cfg.Devices.Get(ctx, types.NamespacedName{Namespace: req.namespace, Name: req.name}, &d); err != nil {
		if apierrors.IsNotFound(err) {
			s.fail(w, "get", apierrors.NewNotFound(rv1.GVR().GroupResource(), req.name))
			return
		}
		s.fail(w, "get", apierrors.NewInternalError(err))
		return
	}
	live := s.liveOf(ctx, &d)
	out := merged(&d, live)
	s.requests.WithLabelValues("get", "200").Inc()
	if req.table {
		t, err := table([]rv1.DeviceReading{out}, out.ResourceVersion, time.Now())
		if err != nil {
			s.fail(w, "get", apierrors.NewInternalError(err))
			return
		}
		writeJSON(w, http.StatusOK, t)
		return
	}
	writeJSON(w, http.StatusOK, &out)
}

// liveOf is what the replica holding d's node holds of d (this one, or
// another asked), nil when none holds anything.
func (s *Server) liveOf(ctx context.Context, d *v1alpha1.Device) *rv1.DeviceReading {
	key := types.NamespacedName{Namespace: d.Namespace, Name: d.Name}
	local := func() *rv1.DeviceReading {
		if snap, ok := s.cfg.Store.Get(key); ok {
			r := liveReading(snap, s.cfg.Replica)
			return &r
		}
		return nil
	}
	if s.cfg.Holder == nil || d.Spec.NodeName == "" {
		return local()
	}
	holder, err := s.cfg.Holder(ctx, d.Spec.NodeName)
	if err != nil {
		s.cfg.Log.V(1).Info("could not find the holder of a node's session", "node", d.Spec.NodeName, "err", err)
		return local()
	}
	if holder == "" || holder == s.cfg.Replica {
		return local()
	}
	addr := s.cfg.Peers()[holder]
	if addr == "" {
		return local()
	}
	list, err := s.askPeer(ctx, addr, key.Namespace, key.Name)
	if err != nil {
		s.peerErrors.WithLabelValues("get").Inc()
		s.cfg.Log.V(1).Info("could not ask the replica holding a node's session", "replica", holder, "err", err)
		return local()
	}
	for i := range list.Items {
		if list.Items[i].Name == key.Name {
			return &list.Items[i]
		}
	}
	return nil
}

// listLive gathers what every replica holds of the Devices in namespace
// (every namespace when empty) named name (any when empty): this one's
// and the others', asked at once. A reading two replicas hold (a session
// moving) is the newer's.
func (s *Server) listLive(ctx context.Context, namespace, name string) map[types.NamespacedName]*rv1.DeviceReading {
	out := map[types.NamespacedName]*rv1.DeviceReading{}
	add := func(r rv1.DeviceReading) {
		key := types.NamespacedName{Namespace: r.Namespace, Name: r.Name}
		if cur := out[key]; cur != nil {
			if t := takenOf(cur); t > takenOf(&r) { // the newest taken of the two, for replays
				if r.Annotations == nil {
					r.Annotations = map[string]string{}
				}
				r.Annotations[takenAnnotation] = strconv.FormatInt(t, 10)
			}
			n, c := r.Newest(), cur.Newest()
			if n.Before(&c) {
				return
			}
		}
		out[key] = &r
	}
	for _, snap := range s.cfg.Store.List(namespace, nil) {
		if name == "" || snap.Key.Name == name {
			add(liveReading(snap, s.cfg.Replica))
		}
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for replica, addr := range s.cfg.Peers() {
		if replica == s.cfg.Replica || addr == "" {
			continue
		}
		wg.Go(func() {
			list, err := s.askPeer(ctx, addr, namespace, name)
			if err != nil {
				s.peerErrors.WithLabelValues("list").Inc()
				s.cfg.Log.Info("could not list another replica's readings", "replica", replica, "err", err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, r := range list.Items {
				add(r)
			}
		})
	}
	wg.Wait()
	return out
}

// readings are the merged readings of the Devices req asks for, and
// when a replica took each one's newest change (for replays).
func (s *Server) readings(ctx context.Context, req *request) ([]rv1.DeviceReading, map[types.NamespacedName]int64, error) {
	var devices []v1alpha1.Device
	if req.name != "" {
		var d v1alpha1.Device
		err := s.cfg.Devices.Get(ctx, types.NamespacedName{Namespace: req.namespace, Name: req.name}, &d)
		if err != nil && !apierrors.IsNotFound(err) {
			return nil, nil, err
		}
		if err == nil {
			devices = append(devices, d)
		}
	} else {
		var list v1alpha1.DeviceList
		opts := []client.ListOption{client.MatchingLabelsSelector{Selector: req.labels}}
		if req.namespace != "" {
			opts = append(opts, client.InNamespace(req.namespace))
		}
		if err := s.cfg.Devices.List(ctx, &list, opts...); err != nil {
			return nil, nil, err
		}
		devices = list.Items
	}
	live := s.listLive(ctx, req.namespace, req.name)
	out := make([]rv1.DeviceReading, 0, len(devices))
	taken := map[types.NamespacedName]int64{}
	for i := range devices {
		d := &devices[i]
		if req.namespace != "" && d.Namespace != req.namespace || !req.labels.Matches(labels.Set(d.Labels)) {
			continue
		}
		key := types.NamespacedName{Namespace: d.Namespace, Name: d.Name}
		if t := takenOf(live[key]); t != 0 {
			taken[key] = t
		}
		out = append(out, merged(d, live[key]))
	}
	slices.SortFunc(out, func(a, b rv1.DeviceReading) int {
		return cmp.Or(cmp.Compare(a.Namespace, b.Namespace), cmp.Compare(a.Name, b.Name))
	})
	return out, taken, nil
}

func (s *Server) list(w http.ResponseWriter, r *http.Request, req *request) {
	items, _, err := s.readings(r.Context(), req)
	if err != nil {
		s.fail(w, "list", apierrors.NewInternalError(err))
		return
	}
	rv := strconv.FormatInt(time.Now().UnixMicro(), 10)
	s.requests.WithLabelValues("list", "200").Inc()
	if req.table {
		t, err := table(items, rv, time.Now())
		if err != nil {
			s.fail(w, "list", apierrors.NewInternalError(err))
			return
		}
		writeJSON(w, http.StatusOK, t)
		return
	}
	writeJSON(w, http.StatusOK, &rv1.DeviceReadingList{TypeMeta: metav1.TypeMeta{APIVersion: rv1.GroupVersion.String(), Kind: rv1.ListKind},
		ListMeta: metav1.ListMeta{ResourceVersion: rv}, Items: items})
}

// watchEvent is a watch event on the wire.
type watchEvent struct {
	Type   string `json:"type"`
	Object any    `json:"object"`
}

// watch streams changes: this replica's as its store takes them, and the
// other replicas' through their peer watches, each laid over the Device's
// status. A reading never goes back (one older than what was sent, from a
// replica that has just lost the node, is skipped).
func (s *Server) watch(w http.ResponseWriter, r *http.Request, req *request) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		s.fail(w, "watch", apierrors.NewInternalError(errors.New("streaming is not supported")))
		return
	}
	replaying := !req.initial
	var gone []tombstone
	if replaying {
		var answerable bool
		gone, answerable = s.deleted.after(req.from - s.cfg.ReplayMargin.Microseconds())
		if !answerable {
			// Before what this replica can answer for: the client lists
			// again, as after the API server's 410.
			s.fail(w, "watch", tooOld(req.from, s.deleted.since))
			return
		}
	}
	ctx, cancel := context.WithTimeout(r.Context(), req.timeout)
	defer cancel()
	s.watches.Inc()
	defer s.watches.Dec()
	// Followed before anything is read, so that nothing falls between.
	local := s.cfg.Store.WatchDevices(req.namespace, req.name)
	defer local.Stop()
	fromPeers := make(chan rv1.DeviceReading, 64)
	go s.followPeers(ctx, req.namespace, req.name, fromPeers)

	s.requests.WithLabelValues("watch", "200").Inc()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	flusher.Flush()
	enc := json.NewEncoder(w)
	type sentState struct {
		newest time.Time
		digest [32]byte
		last   rv1.DeviceReading
	}
	sent := map[types.NamespacedName]*sentState{}
	send := func(typ string, obj rv1.DeviceReading) error {
		var o any = &obj
		if req.table {
			t, err := table([]rv1.DeviceReading{obj}, obj.ResourceVersion, time.Now())
			if err != nil {
				return err
			}
			o = t
		}
		return enc.Encode(watchEvent{Type: typ, Object: o})
	}
	now := func() string { return strconv.FormatInt(time.Now().UnixMicro(), 10) }
	bookmark := func(initialEnd bool) error {
		bm := rv1.DeviceReading{TypeMeta: typeMeta, ObjectMeta: metav1.ObjectMeta{ResourceVersion: now()}}
		if initialEnd {
			bm.Annotations = map[string]string{metav1.InitialEventsAnnotationKey: "true"}
		}
		return enc.Encode(watchEvent{Type: "BOOKMARK", Object: &bm})
	}
	// known: the client holds key (sent here, or in the list it watches
	// from).
	known := func(key types.NamespacedName, created metav1.Time) bool {
		return sent[key] != nil || replaying && !created.IsZero() && !createdAfter(created, req.from)
	}
	emit := func(key types.NamespacedName, live *rv1.DeviceReading) error {
		var d v1alpha1.Device
		if err := s.cfg.Devices.Get(ctx, key, &d); err != nil {
			if !apierrors.IsNotFound(err) {
				return nil // the cache errs only as ctx ends
			}
			st := sent[key]
			switch {
			case st != nil:
				delete(sent, key)
				last := st.last
				last.ResourceVersion = now()
				return send("DELETED", last)
			case replaying:
				// Deleted before this watch sent anything of it: the
				// client had it if it was created before its list.
				if _, done := sent[key]; done {
					return nil
				}
				gone, _ := s.deleted.after(req.from)
				for _, t := range gone {
					if t.key == key && t.created <= req.from && req.labels.Matches(labels.Set(t.labels)) {
						sent[key] = nil
						return send("DELETED", rv1.DeviceReading{TypeMeta: typeMeta, ObjectMeta: metav1.ObjectMeta{
							Namespace: key.Namespace, Name: key.Name, Labels: t.labels, ResourceVersion: now()}})
					}
				}
			}
			return nil
		}
		if !req.labels.Matches(labels.Set(d.Labels)) {
			// Out of the selector now: gone for the client.
			if st := sent[key]; st != nil {
				delete(sent, key)
				last := st.last
				last.ResourceVersion = now()
				return send("DELETED", last)
			}
			return nil
		}
		obj := merged(&d, live)
		newest, dg := obj.Newest().Time, digest(&obj)
		typ := "MODIFIED"
		if st := sent[key]; st != nil {
			if newest.Before(st.newest) || st.digest == dg {
				return nil
			}
		} else if !known(key, d.CreationTimestamp) {
			typ = "ADDED"
		}
		sent[key] = &sentState{newest: newest, digest: dg, last: obj}
		return send(typ, obj)
	}
	if req.initial || replaying {
		items, taken, err := s.readings(ctx, req)
		if err != nil {
			_ = enc.Encode(watchEvent{Type: "ERROR", Object: apierrors.NewInternalError(err).Status()})
			return
		}
		events := make([]replayEvent, 0, len(items))
		if replaying {
			events = replay(items, taken, gone, req.from, s.cfg.ReplayMargin, req.namespace, req.name, req.labels)
			// What was not replayed, the client has: a later change of
			// it is a MODIFIED, and never one going back.
			for _, it := range items {
				key := types.NamespacedName{Namespace: it.Namespace, Name: it.Name}
				if !createdAfter(it.CreationTimestamp, req.from) {
					sent[key] = &sentState{newest: it.Newest().Time, digest: digest(&it), last: it}
				}
			}
		} else {
			for _, it := range items {
				events = append(events, replayEvent{"ADDED", it})
			}
		}
		for _, ev := range events {
			key := types.NamespacedName{Namespace: ev.obj.Namespace, Name: ev.obj.Name}
			if ev.typ == "DELETED" {
				delete(sent, key)
			} else {
				sent[key] = &sentState{newest: ev.obj.Newest().Time, digest: digest(&ev.obj), last: ev.obj}
			}
			if err := send(ev.typ, ev.obj); err != nil {
				return
			}
		}
		if req.bookmark {
			if err := bookmark(true); err != nil {
				return
			}
		}
		flusher.Flush()
	}
	var bookmarks <-chan time.Time
	if req.bookmarks {
		t := time.NewTicker(s.cfg.BookmarkEvery)
		defer t.Stop()
		bookmarks = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-bookmarks:
			if err := bookmark(false); err != nil {
				return
			}
		case <-local.Changed():
			for _, key := range local.Take() {
				var live *rv1.DeviceReading
				if snap, ok := s.cfg.Store.Get(key); ok {
					lr := liveReading(snap, s.cfg.Replica)
					live = &lr
				} else if st := sent[key]; st != nil && st.last.Replica != "" && st.last.Replica != s.cfg.Replica {
					// The Device changed in the API (its status, say) and
					// another replica holds its values: what it last sent
					// stays laid over.
					last := st.last
					live = &last
				}
				if err := emit(key, live); err != nil {
					return
				}
			}
		case lr := <-fromPeers:
			if err := emit(types.NamespacedName{Namespace: lr.Namespace, Name: lr.Name}, &lr); err != nil {
				return
			}
		}
		flusher.Flush()
	}
}

// followPeers streams the other replicas' changes into out until ctx
// ends, following the replicas as they come and go.
func (s *Server) followPeers(ctx context.Context, namespace, name string, out chan<- rv1.DeviceReading) {
	running := map[string]bool{}
	ended := make(chan string, 8)
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		for replica, addr := range s.cfg.Peers() {
			if replica == s.cfg.Replica || addr == "" || running[replica+"@"+addr] {
				continue
			}
			id := replica + "@" + addr
			running[id] = true
			go func() {
				if err := s.followPeer(ctx, addr, namespace, name, out); err != nil && ctx.Err() == nil {
					s.peerErrors.WithLabelValues("watch").Inc()
					s.cfg.Log.V(1).Info("another replica's watch ended", "replica", replica, "err", err)
				}
				select {
				case ended <- id:
				case <-ctx.Done():
				}
			}()
		}
		select {
		case <-ctx.Done():
			return
		case id := <-ended:
			delete(running, id)
		case <-t.C:
		}
	}
}

func (s *Server) peerURL(addr, what, namespace, name string) string {
	return fmt.Sprintf("https://%s/peer/v1/%s?namespace=%s&name=%s", addr, what, namespace, name)
}

func (s *Server) peerRequest(ctx context.Context, addr, what, namespace, name string) (*http.Request, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.peerURL(addr, what, namespace, name), nil)
	if err != nil {
		return nil, err
	}
	req.Host = host
	return req, nil
}

func (s *Server) followPeer(ctx context.Context, addr, namespace, name string, out chan<- rv1.DeviceReading) error {
	req, err := s.peerRequest(ctx, addr, "watch", namespace, name)
	if err != nil {
		return err
	}
	resp, err := s.peerLong.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s answered %s", addr, resp.Status)
	}
	dec := json.NewDecoder(resp.Body)
	for {
		var r rv1.DeviceReading
		if err := dec.Decode(&r); err != nil {
			return err
		}
		select {
		case out <- r:
		case <-ctx.Done():
			return nil
		}
	}
}

func (s *Server) askPeer(ctx context.Context, addr, namespace, name string) (*rv1.DeviceReadingList, error) {
	req, err := s.peerRequest(ctx, addr, "readings", namespace, name)
	if err != nil {
		return nil, err
	}
	resp, err := s.peerHTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %s", addr, resp.Status)
	}
	var list rv1.DeviceReadingList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, err
	}
	return &list, nil
}

// servePeer answers another replica (its certificate of the link CA
// naming a replica): what this one holds, never asking further.
func (s *Server) servePeer(w http.ResponseWriter, r *http.Request, path string) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 || s.cfg.ReplicaCAs == nil {
		s.fail(w, "peer", apierrors.NewUnauthorized("a replica's certificate is required"))
		return
	}
	leaf := r.TLS.PeerCertificates[0]
	if _, err := leaf.Verify(x509.VerifyOptions{Roots: s.cfg.ReplicaCAs, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		s.fail(w, "peer", apierrors.NewUnauthorized("a replica's certificate is required"))
		return
	}
	if _, err := pki.ReplicaFromCert(leaf); err != nil {
		s.fail(w, "peer", apierrors.NewForbidden(rv1.GVR().GroupResource(), "", err))
		return
	}
	q := r.URL.Query()
	namespace, name := q.Get("namespace"), q.Get("name")
	switch path {
	case "/peer/v1/readings":
		list := &rv1.DeviceReadingList{TypeMeta: metav1.TypeMeta{APIVersion: rv1.GroupVersion.String(), Kind: rv1.ListKind}, Items: []rv1.DeviceReading{}}
		for _, snap := range s.cfg.Store.List(namespace, nil) {
			if name == "" || snap.Key.Name == name {
				list.Items = append(list.Items, liveReading(snap, s.cfg.Replica))
			}
		}
		s.requests.WithLabelValues("peer-list", "200").Inc()
		writeJSON(w, http.StatusOK, list)
	case "/peer/v1/watch":
		s.peerWatch(w, r, namespace, name)
	default:
		s.fail(w, "peer", apierrors.NewNotFound(rv1.GVR().GroupResource(), path))
	}
}

func (s *Server) peerWatch(w http.ResponseWriter, r *http.Request, namespace, name string) {
	flusher, ok := w.(http.Flusher)
	if !ok {
		s.fail(w, "peer-watch", apierrors.NewInternalError(errors.New("streaming is not supported")))
		return
	}
	s.watches.Inc()
	defer s.watches.Dec()
	wt := s.cfg.Store.Watch(namespace, name)
	defer wt.Stop()
	s.requests.WithLabelValues("peer-watch", "200").Inc()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	flusher.Flush()
	enc := json.NewEncoder(w)
	ctx := r.Context()
	for {
		select {
		case <-ctx.Done():
			return
		case <-wt.Changed():
			for _, key := range wt.Take() {
				snap, ok := s.cfg.Store.Get(key)
				if !ok {
					continue
				}
				if err := enc.Encode(liveReading(snap, s.cfg.Replica)); err != nil {
					return
				}
			}
			flusher.Flush()
		}
	}
}

func (s *Server) fail(w http.ResponseWriter, verb string, err error) {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		st = apierrors.NewInternalError(err)
	}
	status := st.Status()
	status.TypeMeta = metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}
	code := int(status.Code)
	if code == 0 {
		code = http.StatusInternalServerError
	}
	s.requests.WithLabelValues(verb, strconv.Itoa(code)).Inc()
	writeJSON(w, code, &status)
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(b)
}
