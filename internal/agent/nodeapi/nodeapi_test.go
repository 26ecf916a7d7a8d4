package nodeapi

import (
	"encoding/json"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func mustParse(t *testing.T, method, raw string) apiRequest {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	r, err := parseRequest(method, u)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestParseRequest(t *testing.T) {
	for _, c := range []struct {
		method, url                            string
		verb, collection, namespace, name, sub string
		discovery, initialEvents               bool
	}{
		{method: "GET", url: "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1&limit=500", verb: "list", collection: "v1/pods"},
		{method: "GET", url: "/api/v1/namespaces/ns/secrets/s1", verb: "get", collection: "v1/secrets", namespace: "ns", name: "s1"},
		{method: "GET", url: "/api/v1/namespaces/ns", verb: "get", collection: "v1/namespaces", name: "ns"},
		{method: "GET", url: "/apis/dowse.dev/v1alpha1/namespaces/ns/devices?watch=true&sendInitialEvents=true", verb: "watch", collection: "dowse.dev/v1alpha1/devices", namespace: "ns", initialEvents: true},
		{method: "POST", url: "/api/v1/namespaces/ns/serviceaccounts/sa/token", verb: "create", collection: "v1/serviceaccounts", namespace: "ns", name: "sa", sub: "token"},
		{method: "PATCH", url: "/api/v1/namespaces/ns/pods/p/status", verb: "patch", collection: "v1/pods", namespace: "ns", name: "p", sub: "status"},
		{method: "GET", url: "/apis/dowse.dev/v1alpha1", discovery: true, collection: "dowse.dev/v1alpha1/"},
		{method: "GET", url: "/apis", discovery: true, collection: "/"},
		{method: "GET", url: "/version", discovery: true, collection: "/"},
		{method: "GET", url: "/readyz", collection: "/"},
	} {
		r := mustParse(t, c.method, c.url)
		if r.verb != c.verb || r.collection() != c.collection || r.namespace != c.namespace || r.name != c.name || r.subresource != c.sub ||
			r.discovery != c.discovery || r.initialEvents != c.initialEvents {
			t.Errorf("%s %s: %+v (collection %s)", c.method, c.url, r, r.collection())
		}
	}
	if _, err := parseRequest("GET", &url.URL{Path: "/api/v1/namespaces/ns/pods", RawQuery: "labelSelector=a%20in%20("}); err == nil {
		t.Error("a bad label selector was taken")
	}
	if _, err := parseRequest("GET", &url.URL{Path: "/api/v1/namespaces/../pods/x"}); err == nil {
		t.Error("a path naming .. was taken")
	}
}

func pod(ns, name, node string, labels map[string]string) json.RawMessage {
	raw, _ := json.Marshal(map[string]any{"metadata": map[string]any{"namespace": ns, "name": name, "resourceVersion": "7", "labels": labels},
		"spec": map[string]any{"nodeName": node}})
	return raw
}

func TestStoreAnswersOnlyWithinListedScopes(t *testing.T) {
	dir := t.TempDir()
	s, err := openStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	nodePods := mustParse(t, "GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1")
	if err := s.replace("cert:n1", nodePods, "PodList", "v1", "10", []json.RawMessage{
		pod("a", "p1", "n1", map[string]string{"app": "x"}), pod("b", "p2", "n1", nil)}); err != nil {
		t.Fatal(err)
	}
	names := func(raw json.RawMessage) []string {
		var l struct {
			Items []objectMeta `json:"items"`
		}
		if err := json.Unmarshal(raw, &l); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, it := range l.Items {
			out = append(out, it.Metadata.Name)
		}
		return out
	}
	for url, want := range map[string]string{
		"/api/v1/pods?fieldSelector=spec.nodeName%3Dn1":              "p1,p2",
		"/api/v1/namespaces/a/pods?fieldSelector=spec.nodeName%3Dn1": "p1",
		"/api/v1/namespaces/b/pods?fieldSelector=spec.nodeName%3Dn1": "p2",
	} {
		got, err := s.list("cert:n1", mustParse(t, "GET", url), nil)
		if err != nil || strings.Join(names(got), ",") != want {
			t.Errorf("%s: %v %v, want %s", url, names(got), err, want)
		}
	}
	for _, url := range []string{"/api/v1/pods", "/api/v1/namespaces/a/pods", "/api/v1/pods?fieldSelector=spec.nodeName%3Dn2"} {
		if _, err := s.list("cert:n1", mustParse(t, "GET", url), nil); !errors.Is(err, errNotKept) {
			t.Errorf("%s beyond what was listed: %v", url, err)
		}
	}
	if _, err := s.list("token:someone-else", nodePods, nil); !errors.Is(err, errNotKept) {
		t.Errorf("another caller's list: %v", err)
	}
	// A list again without p2: it is gone, p1 stays.
	if err := s.replace("cert:n1", nodePods, "PodList", "v1", "11", []json.RawMessage{pod("a", "p1", "n1", nil)}); err != nil {
		t.Fatal(err)
	}
	got, _ := s.list("cert:n1", nodePods, nil)
	if strings.Join(names(got), ",") != "p1" {
		t.Errorf("after a list without p2: %v", names(got))
	}
	// Sealed at rest, read back after a restart.
	secrets := mustParse(t, "GET", "/api/v1/namespaces/a/secrets/s1")
	if err := s.put("cert:n1", secrets, json.RawMessage(`{"kind":"Secret","apiVersion":"v1","metadata":{"namespace":"a","name":"s1"},"data":{"k":"c2VjcmV0LXZhbHVlLWluLXRoZS1jbGVhcg=="}}`)); err != nil {
		t.Fatal(err)
	}
	if err := s.close(); err != nil {
		t.Fatal(err)
	}
	raw, _ := os.ReadFile(filepath.Join(dir, "store.db"))
	if strings.Contains(string(raw), "c2VjcmV0LXZhbHVlLWluLXRoZS1jbGVhcg") {
		t.Error("a Secret lies in the clear in the store")
	}
	s, err = openStore(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	if got, err := s.get("cert:n1", secrets); err != nil || !strings.Contains(string(got), "c2VjcmV0") {
		t.Errorf("the Secret after a restart: %s %v", got, err)
	}
	if got, _ := s.list("cert:n1", nodePods, nil); strings.Join(names(got), ",") != "p1" {
		t.Errorf("the pods after a restart: %v", names(got))
	}
	// A store whose key is another's cannot be read.
	if err := os.WriteFile(filepath.Join(dir, "seal.key"), make([]byte, 32), 0o600); err != nil {
		t.Fatal(err)
	}
	s.close()
	if _, err := openStore(dir); err == nil || !strings.Contains(err.Error(), "store.db") {
		t.Errorf("a store sealed with another key opened: %v", err)
	}
}

func TestCredentialsExpire(t *testing.T) {
	s, err := openStore(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	now := time.Now()
	s.accepted("h1", "token:system:serviceaccount:ns:agent", now.Add(time.Minute))
	if id, ok := s.credential("h1", now); !ok || id != "token:system:serviceaccount:ns:agent" {
		t.Errorf("an accepted token: %q %v", id, ok)
	}
	if _, ok := s.credential("h1", now.Add(2*time.Minute)); ok {
		t.Error("an expired token was taken")
	}
	if _, ok := s.credential("h2", now); ok {
		t.Error("a token never accepted was taken")
	}
}

func TestDeviceGateNeeds(t *testing.T) {
	g := newDeviceGate("", "dowse.dev/")
	raw := json.RawMessage(`{"metadata":{"uid":"u1"},"spec":{
		"containers":[{"resources":{"limits":{"dowse.dev/plc.default":"1","cpu":"1"}}},{"resources":{"limits":{"dowse.dev/plc.default":"1"}}}],
		"initContainers":[{"resources":{"limits":{"dowse.dev/cam.default":"2"}}}]}}`)
	uid, needs := g.needs(raw)
	if uid != "u1" || needs["dowse.dev/plc.default"] != 2 || needs["dowse.dev/cam.default"] != 2 || len(needs) != 2 {
		t.Errorf("needs %s %v", uid, needs)
	}
	if !satisfied(needs, map[string]int64{"dowse.dev/plc.default": 2, "dowse.dev/cam.default": 3}) ||
		satisfied(needs, map[string]int64{"dowse.dev/plc.default": 1, "dowse.dev/cam.default": 3}) {
		t.Error("satisfied miscounts")
	}
	if _, needs := g.needs(json.RawMessage(`{"metadata":{"uid":"u2"},"spec":{"containers":[{}]}}`)); len(needs) != 0 {
		t.Errorf("a pod without devices needs %v", needs)
	}
}

func TestTokenClaims(t *testing.T) {
	sub, exp, err := tokenClaims("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6bnM6YWdlbnQiLCJleHAiOjE5MDAwMDAwMDB9.sig")
	if err != nil || sub != "system:serviceaccount:ns:agent" || exp.Unix() != 1900000000 {
		t.Errorf("claims %q %v %v", sub, exp, err)
	}
	for _, bad := range []string{"opaque-token", "a.b.c", "a.e30.c"} {
		if _, _, err := tokenClaims(bad); err == nil {
			t.Errorf("%q taken", bad)
		}
	}
}

func TestDeviceGateHoldsThenReleases(t *testing.T) {
	g := newDeviceGate("", "dowse.dev/")
	broker := json.RawMessage(`{"metadata":{"uid":"b1","name":"broker"},"spec":{"containers":[{"resources":{"limits":{"dowse.dev/plc.default":"1"}}}]}}`)
	plain := json.RawMessage(`{"metadata":{"uid":"a1","name":"agent"},"spec":{"containers":[{}]}}`)
	if !g.admit("cert:n1", plain, nil) {
		t.Error("a pod without devices was held")
	}
	if g.admit("cert:n1", broker, map[string]int64{"dowse.dev/other.default": 3}) {
		t.Error("a broker was listed before its device is allocatable")
	}
	sent := map[string]bool{}
	if got, _ := g.releasedSince("cert:n1", sent); len(got) != 0 {
		t.Errorf("released before its device: %s", got)
	}
	if n := g.releaseSatisfied(map[string]int64{"dowse.dev/plc.default": 1}); n != 1 {
		t.Errorf("released %d", n)
	}
	got, _ := g.releasedSince("cert:n1", sent)
	if len(got) != 1 || !strings.Contains(string(got[0]), "broker") {
		t.Errorf("released %s", got)
	}
	if again, _ := g.releasedSince("cert:n1", sent); len(again) != 0 {
		t.Errorf("released twice to one watch: %s", again)
	}
	if other, _ := g.releasedSince("token:someone", map[string]bool{}); len(other) != 0 {
		t.Errorf("another caller's watch got %s", other)
	}
	// Listed again later (a relist), the released pod is no longer held.
	if !g.admit("cert:n1", broker, nil) {
		t.Error("a released pod was held again")
	}
	g.reset()
	if g.admit("cert:n1", broker, nil) {
		t.Error("after a reset (back online) a pod released before still passed without its device")
	}
}
