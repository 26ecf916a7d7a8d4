package kubeflags

import (
	"flag"
	"io"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

func TestClient(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c := Client{QPS: 200, Burst: 400}
	c.AddFlags(fs)
	if got := fs.Lookup("kube-api-qps").DefValue; got != "200" {
		t.Errorf("--kube-api-qps default %q, want 200", got)
	}
	if err := fs.Parse([]string{"--kube-api-qps=0.5", "--kube-api-burst=3", "--kubeconfig=/k"}); err != nil {
		t.Fatal(err)
	}
	if c != (Client{Kubeconfig: "/k", QPS: 0.5, Burst: 3}) {
		t.Errorf("parsed %+v", c)
	}

	override := &rest.Config{Host: "https://127.0.0.1:6443", QPS: 5}
	got, err := Client{QPS: 100, Burst: 200}.Load(override, "dowse-test")
	if err != nil {
		t.Fatal(err)
	}
	if got == override || got.Host != override.Host || got.QPS != 100 || got.Burst != 200 || got.UserAgent != "dowse-test" || override.QPS != 5 {
		t.Errorf("Load(override) = %+v (override now %+v): want a copy with the limits and user agent", got, override)
	}
	if got, _ := (Client{}).Load(override, "u"); got.QPS != 5 {
		t.Errorf("zero QPS replaced the config's: %v", got.QPS)
	}
	_, err = Client{Kubeconfig: filepath.Join(t.TempDir(), "missing")}.Load(nil, "u")
	if err == nil || !strings.Contains(err.Error(), "loading kubeconfig") {
		t.Errorf("a missing kubeconfig: %v", err)
	}
}

func TestServing(t *testing.T) {
	s := Serving{HealthAddr: "0"}
	s.SetDefaults(":1", ":2")
	if s != (Serving{MetricsAddr: ":1", HealthAddr: "0", PprofAddr: "0"}) {
		t.Errorf("SetDefaults: %+v", s)
	}
	off := Off()
	off.SetDefaults(":1", ":2")
	if off != Off() {
		t.Errorf("Off with defaults serves: %+v", off)
	}
}

func TestValues(t *testing.T) {
	var l []string
	v := List(&l)
	for in, want := range map[string][]string{"a,b": {"a", "b"}, " a , ,b,": {"a", "b"}, "": nil, ",": nil} { //nolint:gocritic // the spaces are the test
		if err := v.Set(in); err != nil || !reflect.DeepEqual(l, want) {
			t.Errorf("List.Set(%q) = %q, %v; want %q", in, l, err, want)
		}
	}
	l = []string{"x", "y"}
	if v.String() != "x,y" {
		t.Errorf("List.String() = %q", v.String())
	}
	var f float32
	if err := Float32(&f).Set("1e3"); err != nil || f != 1000 {
		t.Errorf("Float32.Set(1e3) = %v, %v", f, err)
	}
	if err := Float32(&f).Set("1e39"); err == nil {
		t.Errorf("Float32.Set(1e39) accepted (beyond float32)")
	}
	d := 5 * time.Minute
	dv := DurationOrNone(&d)
	if dv.String() != "5m0s" {
		t.Errorf("DurationOrNone default %q", dv.String())
	}
	if err := dv.Set("0"); err != nil || d != -1 || dv.String() != "0s" {
		t.Errorf("DurationOrNone.Set(0) = %v, %v (%q); want -1, shown 0s", d, err, dv.String())
	}
	if err := dv.Set("2s"); err != nil || d != 2*time.Second {
		t.Errorf("DurationOrNone.Set(2s) = %v, %v", d, err)
	}
	n := 10
	nv := IntOrNone(&n)
	if err := nv.Set("0"); err != nil || n != -1 || nv.String() != "0" {
		t.Errorf("IntOrNone.Set(0) = %v, %v", n, err)
	}
	if err := nv.Set("x"); err == nil {
		t.Errorf("IntOrNone.Set(x) accepted")
	}
	t.Setenv("DOWSE_TEST_ENV", "")
	if EnvOr("DOWSE_TEST_ENV", "def") != "def" {
		t.Errorf("EnvOr of an empty variable")
	}
	t.Setenv("DOWSE_TEST_ENV", "set")
	if EnvOr("DOWSE_TEST_ENV", "def") != "set" {
		t.Errorf("EnvOr of a set variable")
	}
}
