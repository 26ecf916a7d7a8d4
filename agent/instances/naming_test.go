package instances

import (
	"fmt"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestDeviceHash(t *testing.T) {
	if DeviceHash("cam-1", true, "node-a") != DeviceHash("cam-1", true, "node-b") {
		t.Fatal("a shared device must hash alike on every node")
	}
	if DeviceHash("usb-1", false, "node-a") == DeviceHash("usb-1", false, "node-b") {
		t.Fatal("a local device must hash differently per node")
	}
	if DeviceHash("a", false, "bc") == DeviceHash("ab", false, "c") {
		t.Fatal("id/node boundary is ambiguous")
	}
	if DeviceHash("x", true, "") == DeviceHash("x", false, "") {
		t.Fatal("shared and local hashes of one id should differ")
	}
	if got := DeviceHash("cam-1", true, ""); len(got) != hashLen {
		t.Fatalf("hash %q has length %d", got, len(got))
	}
}

func TestInstanceNameFitsExtendedResource(t *testing.T) {
	for _, cfg := range []string{"c", "debug-echo", strings.Repeat("a", 46), strings.Repeat("a", 47), strings.Repeat("b", 253), strings.Repeat("ab-", 20) + "x", "x." + strings.Repeat("y", 60)} {
		name := InstanceName(cfg, DeviceHash("dev", true, ""))
		if len(name) > maxNameLen {
			t.Errorf("%q: name %q is %d long", cfg, name, len(name))
		}
		if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
			t.Errorf("%q: name %q is not a valid object name: %v", cfg, name, errs)
		}
		if errs := validation.IsQualifiedName("dowse.dev/" + name); len(errs) > 0 {
			t.Errorf("%q: resource dowse.dev/%s is invalid: %v", cfg, name, errs)
		}
	}
	if got := InstanceName("debug-echo", "0123456789abcdef"); got != "debug-echo-0123456789abcdef" {
		t.Fatalf("got %q", got)
	}
}

func TestNoCollisionsAmong100kDevices(t *testing.T) {
	seen := make(map[string]string, 100000)
	for i := range 100000 {
		id := fmt.Sprintf("device-%d", i)
		h := DeviceHash(id, true, "")
		if other, ok := seen[h]; ok {
			t.Fatalf("%s and %s collide on %s", id, other, h)
		}
		seen[h] = id
	}
}
