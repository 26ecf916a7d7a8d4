package console

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/cookiejar"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"sigs.k8s.io/controller-runtime/pkg/client"

	readingsv1 "github.com/dowse-dev/dowse/shared/api/readings/v1alpha1"
)

// TestMain turns client-go's watch-list off: the fake dynamic client
// serves no initial events on a watch (a real API server does).
func TestMain(m *testing.M) {
	os.Setenv("KUBE_FEATURE_WatchListClient", "false")
	os.Exit(m.Run())
}

func device(ns, name, state string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{}
	u.SetAPIVersion("dowse.dev/v1alpha1")
	u.SetKind("Device")
	u.SetNamespace(ns)
	u.SetName(name)
	_ = unstructured.SetNestedField(u.Object, state, "status", "state")
	return u
}

func start(t *testing.T, set func(context.Context, client.ObjectKey, string, string) error, objs ...runtime.Object) *Server {
	t.Helper()
	return startWith(t, set, nil, objs...)
}

// startWith is start with the console's Readings.
func startWith(t *testing.T, set func(context.Context, client.ObjectKey, string, string) error, readings func(context.Context) bool, objs ...runtime.Object) *Server {
	t.Helper()
	lists := map[schema.GroupVersionResource]string{}
	for _, k := range kinds {
		lists[schema.GroupVersionResource{Group: "dowse.dev", Version: "v1alpha1", Resource: k.plural}] = k.kind + "List"
	}
	lists[schema.GroupVersionResource{Version: "v1", Resource: "events"}] = "EventList"
	lists[readingsv1.GVR()] = readingsv1.ListKind
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), lists, objs...)
	s, err := New(Config{Listen: "127.0.0.1:0", Namespace: "plant", Dynamic: dyn, SetDesired: set, Heartbeat: 50 * time.Millisecond, Readings: readings})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return s
}

// loggedIn is a browser that opened the printed address: it holds the
// session cookie.
func loggedIn(t *testing.T, s *Server) *http.Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	c := &http.Client{Jar: jar}
	res, err := c.Get(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK || res.Request.URL.RawQuery != "" {
		t.Fatalf("login: %s at %s, want 200 at the address without the login", res.Status, res.Request.URL)
	}
	return c
}

// TestPageAndWrites: the page carries its token; a write needs it and
// goes through SetDesired, whose refusal comes back in words; another
// Host name is refused.
func TestPageAndWrites(t *testing.T) {
	var got []string
	s := start(t, func(_ context.Context, key client.ObjectKey, prop, value string) error {
		got = append(got, key.String()+" "+prop+"="+value)
		if value == "99" {
			return errors.New("property setpoint: 99 is above the maximum 30")
		}
		return nil
	})
	browser := loggedIn(t, s)
	res, err := browser.Get(s.Address())
	if err != nil {
		t.Fatal(err)
	}
	page := new(strings.Builder)
	_, _ = bufio.NewReader(res.Body).WriteTo(page)
	res.Body.Close()
	if !strings.Contains(page.String(), `content="`+s.token+`"`) || !strings.Contains(page.String(), `name="dowse-namespace" content="plant"`) {
		t.Fatalf("page lacks its token or namespace:\n%s", page)
	}
	post := func(token, body string) (int, map[string]string) {
		req, _ := http.NewRequest(http.MethodPost, s.Address()+"api/desired", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("X-Dowse-Token", token)
		}
		res, err := browser.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var m map[string]string
		_ = json.NewDecoder(res.Body).Decode(&m)
		return res.StatusCode, m
	}
	body := `{"namespace":"plant","device":"boiler","property":"setpoint","value":"%s"}`
	if code, m := post("", strings.Replace(body, "%s", "21", 1)); code != http.StatusForbidden || !strings.Contains(m["error"], "token") {
		t.Errorf("without the token: %d %v", code, m)
	}
	if code, m := post(s.token, strings.Replace(body, "%s", "21", 1)); code != http.StatusOK || m["set"] != "setpoint=21" {
		t.Errorf("with the token: %d %v", code, m)
	}
	if code, m := post(s.token, strings.Replace(body, "%s", "99", 1)); code != http.StatusUnprocessableEntity || m["error"] != "property setpoint: 99 is above the maximum 30" {
		t.Errorf("refused: %d %v", code, m)
	}
	if code, m := post(s.token, `{"namespace":"plant"}`); code != http.StatusBadRequest || m["error"] == "" {
		t.Errorf("incomplete: %d %v", code, m)
	}
	if len(got) != 2 || got[0] != "plant/boiler setpoint=21" {
		t.Errorf("SetDesired calls %v", got)
	}
	req, _ := http.NewRequest(http.MethodGet, s.Address(), nil)
	req.Host = "evil.example:80"
	if res, err := browser.Do(req); err != nil || res.StatusCode != http.StatusForbidden {
		t.Errorf("another Host: %v %v, want 403", err, res)
	}
}

// reading is a DeviceReading as the readings API serves it.
func reading(ns, name, value string, at time.Time) *unstructured.Unstructured {
	r := readingsv1.DeviceReading{TypeMeta: metav1.TypeMeta{APIVersion: readingsv1.GroupVersion.String(), Kind: readingsv1.Kind},
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Properties: []readingsv1.PropertyReading{{Name: "temperature", Value: value, Time: metav1.NewMicroTime(at), Source: readingsv1.SourceLive}}}
	o, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&r)
	if err != nil {
		panic(err)
	}
	return &unstructured.Unstructured{Object: o}
}

// streamOf opens the page's main stream and decodes its messages.
func streamOf(t *testing.T, s *Server) <-chan message {
	t.Helper()
	res, err := loggedIn(t, s).Get(s.Address() + "api/watch?namespace=plant")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Body.Close() })
	if ct := res.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("content type %q", ct)
	}
	msgs := make(chan message, 100)
	go func() {
		sc := bufio.NewScanner(res.Body)
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var m message
				if json.Unmarshal([]byte(data), &m) == nil {
					msgs <- m
				}
			}
		}
		close(msgs)
	}()
	return msgs
}

// TestWatchStream: the stream lists the namespace's objects, says when a
// kind is synced, and sends changes as they happen.
func TestWatchStream(t *testing.T) {
	s := start(t, func(context.Context, client.ObjectKey, string, string) error { return nil }, device("plant", "boiler", "ok"), device("other", "pump", "ok"))
	msgs := streamOf(t, s)
	synced := map[string]bool{}
	var devices []string
	timeout := time.After(10 * time.Second)
	for len(synced) < len(kinds) {
		select {
		case m, ok := <-msgs:
			if !ok {
				t.Fatal("stream ended")
			}
			switch m.Op {
			case "synced":
				synced[m.Kind] = true
			case "upsert":
				u := unstructured.Unstructured{Object: m.Object}
				devices = append(devices, u.GetNamespace()+"/"+u.GetName())
			}
		case <-timeout:
			t.Fatalf("synced %v, devices %v after 10s", synced, devices)
		}
	}
	if len(devices) != 1 || devices[0] != "plant/boiler" {
		t.Errorf("devices %v, want plant/boiler only", devices)
	}
}

// TestWatchStreamSource: the stream says first where reported values
// come from; when the API server serves the readings API it also lists
// and watches the namespace's DeviceReadings, otherwise it never asks for
// them.
func TestWatchStreamSource(t *testing.T) {
	set := func(context.Context, client.ObjectKey, string, string) error { return nil }
	objs := []runtime.Object{device("plant", "boiler", "ok"), reading("plant", "boiler", "23.3", time.Now()), reading("other", "pump", "1", time.Now())}
	for _, tc := range []struct {
		served bool
		want   string
	}{{true, readingsv1.SourceLive}, {false, readingsv1.SourceStatus}} {
		t.Run(tc.want, func(t *testing.T) {
			var asked atomic.Int32
			s := startWith(t, set, func(context.Context) bool { asked.Add(1); return tc.served }, objs...)
			msgs := streamOf(t, s)
			first, ok := <-msgs
			if !ok || first.Kind != readingKind || first.Op != "source" || first.Source != tc.want {
				t.Fatalf("first message %+v, want the source %s", first, tc.want)
			}
			if n := asked.Load(); n != 1 {
				t.Errorf("Readings asked %d times, want once a stream", n)
			}
			wantSynced := len(kinds)
			if tc.served {
				wantSynced++
			}
			synced := map[string]bool{}
			var readings []string
			timeout := time.After(10 * time.Second)
			for len(synced) < wantSynced {
				select {
				case m, ok := <-msgs:
					if !ok {
						t.Fatal("stream ended")
					}
					switch {
					case m.Op == "synced":
						synced[m.Kind] = true
					case m.Op == "upsert" && m.Kind == readingKind:
						var r readingsv1.DeviceReading
						if err := runtime.DefaultUnstructuredConverter.FromUnstructured(m.Object, &r); err != nil {
							t.Fatal(err)
						}
						readings = append(readings, r.Namespace+"/"+r.Name+" "+r.Properties[0].Value)
					}
				case <-timeout:
					t.Fatalf("synced %v after 10s", synced)
				}
			}
			if tc.served && (len(readings) != 1 || readings[0] != "plant/boiler 23.3") {
				t.Errorf("readings %v, want plant/boiler's only", readings)
			}
			if !tc.served && (len(readings) != 0 || synced[readingKind]) {
				t.Errorf("readings %v (synced %v) though the API is not served", readings, synced[readingKind])
			}
		})
	}
}

// TestEveryPathNeedsTheLogin: without the session cookie every path is
// refused, a wrong login too; the login works once, and the page may not
// be framed.
func TestEveryPathNeedsTheLogin(t *testing.T) {
	var set int
	s := start(t, func(context.Context, client.ObjectKey, string, string) error { set++; return nil })
	for _, path := range []string{"", "assets/app.js", "api/watch?namespace=plant", "api/events?namespace=plant&kind=Device&name=boiler", "?login=" + strings.Repeat("0", len(s.login))} {
		res, err := http.Get(s.Address() + path)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusUnauthorized {
			t.Errorf("GET /%s without the cookie: %s, want 401", path, res.Status)
		}
	}
	res, err := http.Post(s.Address()+"api/desired", "application/json", strings.NewReader(`{"namespace":"plant","device":"boiler","property":"setpoint","value":"1"}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized || set != 0 {
		t.Errorf("POST api/desired without the cookie: %s and %d writes, want 401 and none", res.Status, set)
	}
	browser := loggedIn(t, s)
	res, err = browser.Get(s.Address())
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if csp := res.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "frame-ancestors 'none'") {
		t.Errorf("Content-Security-Policy %q lacks frame-ancestors 'none'", csp)
	}
	var cookie *http.Cookie
	for _, c := range browser.Jar.Cookies(res.Request.URL) {
		cookie = c
	}
	if cookie == nil || cookie.Name != s.cookie {
		t.Fatalf("cookies %v, want %s", browser.Jar.Cookies(res.Request.URL), s.cookie)
	}
	// A second console on this machine: the browser keeps cookies per host,
	// so each console's cookie has a name of its own, and logging in to one
	// leaves the other's session alone.
	other := start(t, func(context.Context, client.ObjectKey, string, string) error { return nil })
	if other.cookie == s.cookie {
		t.Fatalf("two consoles share the cookie name %s", s.cookie)
	}
	res, err = browser.Get(other.URL())
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	for _, srv := range []*Server{s, other} {
		res, err := browser.Get(srv.Address() + "assets/app.js")
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			t.Errorf("console %s after logging in to both: %s", srv.Address(), res.Status)
		}
	}
	// A second browser (or a process that read the address later) gets
	// nothing with the spent login.
	jar, _ := cookiejar.New(nil)
	res, err = (&http.Client{Jar: jar}).Get(s.URL())
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Errorf("the login used twice: %s, want 401", res.Status)
	}
}

// TestListenLoopbackOnly: a non-loopback listener needs AllowRemote.
func TestListenLoopbackOnly(t *testing.T) {
	dyn := dynamicfake.NewSimpleDynamicClient(runtime.NewScheme())
	set := func(context.Context, client.ObjectKey, string, string) error { return nil }
	for _, addr := range []string{"0.0.0.0:0", ":0", "[::]:0"} {
		if _, err := New(Config{Listen: addr, Dynamic: dyn, SetDesired: set}); err == nil || !strings.Contains(err.Error(), "--allow-remote") {
			t.Errorf("listen %s: %v, want a refusal naming --allow-remote", addr, err)
		}
	}
	for _, addr := range []string{"127.0.0.1:0", "localhost:0", "[::1]:0"} {
		s, err := New(Config{Listen: addr, Dynamic: dyn, SetDesired: set})
		if err != nil {
			if strings.Contains(err.Error(), "--allow-remote") {
				t.Errorf("listen %s refused: %v", addr, err)
			}
			continue // e.g. no IPv6 loopback here
		}
		s.ln.Close()
	}
	s, err := New(Config{Listen: "0.0.0.0:0", AllowRemote: true, Dynamic: dyn, SetDesired: set})
	if err != nil {
		t.Fatalf("AllowRemote: %v", err)
	}
	s.ln.Close()
}
