package v1alpha1

import (
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
	if got := DeviceHash("cam-1", true, ""); len(got) != HashLen {
		t.Fatalf("hash %q has length %d", got, len(got))
	}
}

func TestInstanceNameFitsExtendedResource(t *testing.T) {
	for _, cfg := range []string{"c", "debug-echo", strings.Repeat("a", 46), strings.Repeat("a", 47), strings.Repeat("b", 253), strings.Repeat("ab-", 20) + "x", "x." + strings.Repeat("y", 60)} {
		name := InstanceName(cfg, DeviceHash("dev", true, ""))
		if len(name) > maxResourceNameLen {
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

// Every derived name reads back to what made it, for names as the agent
// makes them (long and short Configuration names, dots and dashes).
func TestDerivedNamesRoundTrip(t *testing.T) {
	for _, cfg := range []string{"c", "debug-echo", "x.y-z", strings.Repeat("a", 47), strings.Repeat("ab-", 30)} {
		for _, shared := range []bool{true, false} {
			hash := DeviceHash("dev-"+cfg, shared, "node-a")
			name := InstanceName(cfg, hash)
			if got := InstanceHash(name); got != hash {
				t.Errorf("InstanceHash(%q) = %q, want %q", name, got, hash)
			}
			for _, n := range []string{name, cfg} {
				r := ResourceName(n)
				if got, ok := ParseResourceName(r); !ok || got != n {
					t.Errorf("ParseResourceName(%q) = %q, %v", r, got, ok)
				}
			}
			if err := ValidateResourceName(ResourceName(name)); err != nil {
				t.Errorf("an Instance's resource must be valid: %v", err)
			}
			inst := &Instance{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: InstanceSpec{ConfigurationName: cfg, Capacity: 3}}
			gotCfg, gotHash, ok := ParseCDIName(inst.CDIName())
			if !ok || gotCfg != cfg || gotHash != hash || !strings.HasPrefix(inst.CDIName(), CDIKind(cfg)+"=") {
				t.Errorf("ParseCDIName(%q) = %q, %q, %v", inst.CDIName(), gotCfg, gotHash, ok)
			}
			for n, id := range inst.SlotIDs() {
				if h, gotN, ok := ParseSlotID(id); !ok || h != hash || gotN != n || SlotID(name, n) != id {
					t.Errorf("ParseSlotID(%q) = %q, %d, %v", id, h, gotN, ok)
				}
			}
		}
	}
	for _, bad := range []string{"", "nohyphen", "-1", "a-", "a-x", "a--1", "a-01"} {
		if h, n, ok := ParseSlotID(bad); ok {
			t.Errorf("ParseSlotID(%q) = %q, %d, true", bad, h, n)
		}
	}
	for _, bad := range []string{"", "dowse.dev/", "example.com/x", "x"} {
		if n, ok := ParseResourceName(bad); ok {
			t.Errorf("ParseResourceName(%q) = %q, true", bad, n)
		}
	}
	for _, bad := range []string{"", "dowse.dev/c", "dowse.dev/=h", "dowse.dev/c=", "other/c=h"} {
		if c, h, ok := ParseCDIName(bad); ok {
			t.Errorf("ParseCDIName(%q) = %q, %q, true", bad, c, h)
		}
	}
}

func TestSlotIDs(t *testing.T) {
	inst := &Instance{ObjectMeta: metav1.ObjectMeta{Name: "debug-echo-a1b2c3"}, Spec: InstanceSpec{Capacity: 3}}
	got := strings.Join(inst.SlotIDs(), ",")
	if got != "a1b2c3-0,a1b2c3-1,a1b2c3-2" {
		t.Fatalf("SlotIDs = %s", got)
	}
	inst.Spec.Capacity = 0
	if got := inst.SlotIDs(); len(got) != 1 {
		t.Fatalf("capacity 0 gives %v, want one slot", got)
	}
	if h := InstanceHash("nohash"); h != "nohash" {
		t.Fatalf("InstanceHash without '-' = %q", h)
	}
}

func TestResourceName(t *testing.T) {
	if r := ResourceName("debug-echo-a1b2c3"); ValidateResourceName(r) != nil || r != "dowse.dev/debug-echo-a1b2c3" {
		t.Fatalf("ResourceName = %q, %v", r, ValidateResourceName(r))
	}
	if err := ValidateResourceName(ResourceName(strings.Repeat("a", 63))); err != nil {
		t.Fatalf("63 characters must be fine: %v", err)
	}
	if err := ValidateResourceName(ResourceName(strings.Repeat("a", 64))); err == nil {
		t.Fatal("64 characters must be refused")
	}
}

func TestHasNode(t *testing.T) {
	inst := &Instance{Status: InstanceStatus{Nodes: []InstanceNode{{Name: "a"}, {Name: "b"}}}}
	if !inst.HasNode("a") || !inst.HasNode("b") || inst.HasNode("c") || (&Instance{}).HasNode("") {
		t.Fatal("HasNode is wrong")
	}
}
