package registry

import (
	"errors"
	"testing"
	"time"
)

func TestRegisterValidates(t *testing.T) {
	r := New("/var/lib/dowse")
	cases := []struct {
		name string
		h    Handler
		ok   bool
	}{
		{"uds inside", Handler{Name: "onvif", Endpoint: "/var/lib/dowse/onvif.sock"}, true},
		{"network", Handler{Name: "opcua", Endpoint: "10.0.0.1:8080", EndpointType: Network}, true},
		{"bad name", Handler{Name: "Bad_Name", Endpoint: "/var/lib/dowse/x.sock"}, false},
		{"empty name", Handler{Name: "", Endpoint: "/var/lib/dowse/x.sock"}, false},
		{"outside", Handler{Name: "evil", Endpoint: "/run/containerd/containerd.sock"}, false},
		{"escape with dots", Handler{Name: "evil", Endpoint: "/var/lib/dowse/../../../run/x.sock"}, false},
		{"prefix trick", Handler{Name: "evil", Endpoint: "/var/lib/dowse-other/x.sock"}, false},
		{"the dir itself", Handler{Name: "evil", Endpoint: "/var/lib/dowse"}, false},
		{"relative", Handler{Name: "evil", Endpoint: "x.sock"}, false},
		{"network without port", Handler{Name: "n", Endpoint: "10.0.0.1", EndpointType: Network}, false},
		{"akri network", Handler{Name: "akri", Endpoint: "http://10.0.0.1:10000", EndpointType: Network}, true},
		{"akri network ipv6", Handler{Name: "akri6", Endpoint: "http://[fd00::1]:10000", EndpointType: Network}, true},
		{"https", Handler{Name: "n", Endpoint: "https://10.0.0.1:10000", EndpointType: Network}, false},
		{"http without port", Handler{Name: "n", Endpoint: "http://10.0.0.1", EndpointType: Network}, false},
		{"unknown type", Handler{Name: "n", Endpoint: "/var/lib/dowse/x.sock", EndpointType: 7}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := r.Register(c.h)
			if c.ok && err != nil {
				t.Fatalf("unexpected error: %v", err)
			}
			if !c.ok {
				var inv *InvalidError
				if !errors.As(err, &inv) {
					t.Fatalf("want InvalidError, got %v", err)
				}
			}
		})
	}
}

// An endpoint registered as Akri's handlers do (http://host:port) is kept
// as the host:port the agent dials.
func TestAkriNetworkEndpointIsHostPort(t *testing.T) {
	r := New("/var/lib/dowse")
	if err := r.Register(Handler{Name: "akri", Endpoint: "http://10.0.0.1:10000", EndpointType: Network, Protocol: ProtocolV0}); err != nil {
		t.Fatal(err)
	}
	h, ok := r.Get("akri")
	if !ok || h.Endpoint != "10.0.0.1:10000" {
		t.Fatalf("registered %+v, want endpoint 10.0.0.1:10000", h)
	}
}

func TestReRegistrationReplacesAndNotifies(t *testing.T) {
	r := New("/s")
	ch, cancel := r.Watch()
	defer cancel()
	if err := r.Register(Handler{Name: "debug-echo", Endpoint: "/s/a.sock"}); err != nil {
		t.Fatal(err)
	}
	expectNotification(t, ch, "debug-echo")
	first, _ := r.Get("debug-echo")

	// Identical values: no change, no notification.
	if err := r.Register(Handler{Name: "debug-echo", Endpoint: "/s/a.sock"}); err != nil {
		t.Fatal(err)
	}
	select {
	case n := <-ch:
		t.Fatalf("unexpected notification %q for an identical registration", n)
	case <-time.After(50 * time.Millisecond):
	}
	if again, _ := r.Get("debug-echo"); again.Generation != first.Generation {
		t.Fatalf("generation changed on identical registration: %d -> %d", first.Generation, again.Generation)
	}

	if err := r.Register(Handler{Name: "debug-echo", Endpoint: "/s/b.sock", Shared: true}); err != nil {
		t.Fatal(err)
	}
	expectNotification(t, ch, "debug-echo")
	got, ok := r.Get("debug-echo")
	if !ok || got.Endpoint != "/s/b.sock" || !got.Shared || got.Generation <= first.Generation {
		t.Fatalf("re-registration did not replace: %+v", got)
	}
	if _, ok := r.Get("other"); ok {
		t.Fatal("unknown handler found")
	}
}

func expectNotification(t *testing.T, ch <-chan string, want string) {
	t.Helper()
	select {
	case n := <-ch:
		if n != want {
			t.Fatalf("notified %q, want %q", n, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no notification")
	}
}
