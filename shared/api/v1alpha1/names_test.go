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
// makes them (long and short Configuration names, dots and dashes, names
// that start with a digit), and the resource names of two namespaces
// differ.
func TestDerivedNamesRoundTrip(t *testing.T) {
	for _, cfg := range []string{"c", "1cams", "debug-echo", "x.y-z", strings.Repeat("a", 47), strings.Repeat("ab-", 30), strings.Repeat("a.b", 80) + "c"} {
		for _, ns := range []string{"default", "t", "0", strings.Repeat("n", 63)} {
			for _, shared := range []bool{true, false} {
				hash := DeviceHash("dev-"+cfg, shared, "node-a")
				name := InstanceName(cfg, hash)
				if got := InstanceHash(name); got != hash {
					t.Errorf("InstanceHash(%q) = %q, want %q", name, got, hash)
				}
				for _, n := range []string{name, cfg} {
					r := ResourceName(ns, n)
					if err := ValidateResourceName(r); err != nil {
						t.Errorf("resource of %s/%s: %v", ns, n, err)
					}
					gotNS, got, ok := ParseResourceName(r)
					if long := len(n)+1+len(ns) > maxResourceNameLen; ok == long || (ok && (gotNS != ns || got != n)) {
						t.Errorf("ParseResourceName(%q) = %q, %q, %v (hashed form: %v)", r, gotNS, got, ok, long)
					}
					if r == ResourceName(ns+"x", n) || r == ResourceName(ns, n+"x") {
						t.Errorf("%s names two resources", r)
					}
				}
				inst := &Instance{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: InstanceSpec{ConfigurationName: cfg, Capacity: 3}}
				if inst.ResourceName() != ResourceName(ns, name) {
					t.Errorf("Instance.ResourceName() = %q", inst.ResourceName())
				}
				gotNS, gotName, ok := ParseCDIName(inst.CDIName())
				if !ok || gotNS != ns || gotName != name || !strings.HasPrefix(inst.CDIName(), CDIKind+"=") {
					t.Errorf("ParseCDIName(%q) = %q, %q, %v", inst.CDIName(), gotNS, gotName, ok)
				}
				if inst.LegacyCDIName() != LegacyCDIName(cfg, hash) || LegacyResourceName(name) != "dowse.dev/"+name {
					t.Errorf("legacy names %q %q", inst.LegacyCDIName(), LegacyResourceName(name))
				}
				for n, id := range inst.SlotIDs() {
					if h, gotN, ok := ParseSlotID(id); !ok || h != hash || gotN != n || SlotID(name, n) != id {
						t.Errorf("ParseSlotID(%q) = %q, %d, %v", id, h, gotN, ok)
					}
				}
			}
		}
	}
	for _, bad := range []string{"", "nohyphen", "-1", "a-", "a-x", "a--1", "a-01"} {
		if h, n, ok := ParseSlotID(bad); ok {
			t.Errorf("ParseSlotID(%q) = %q, %d, true", bad, h, n)
		}
	}
	for _, bad := range []string{"", "dowse.dev/", "example.com/x.y", "x", "dowse.dev/nodot-0123456789abcdef", "dowse.dev/.ns", "dowse.dev/name."} {
		if ns, n, ok := ParseResourceName(bad); ok {
			t.Errorf("ParseResourceName(%q) = %q, %q, true", bad, ns, n)
		}
	}
	for _, bad := range []string{"", "dowse.dev/instance", "dowse.dev/instance=", "dowse.dev/instance=nodot", "dowse.dev/instance=.ns", "dowse.dev/c=h", "other/instance=a.b"} {
		if ns, n, ok := ParseCDIName(bad); ok {
			t.Errorf("ParseCDIName(%q) = %q, %q, true", bad, ns, n)
		}
	}
}

// The names that collided before the namespace was in them: two
// namespaces' Configurations "cams" seeing one device.
func TestNamespacesDoNotShareNames(t *testing.T) {
	hash := DeviceHash("cam-1", true, "")
	a := &Instance{ObjectMeta: metav1.ObjectMeta{Name: InstanceName("cams", hash), Namespace: "team-a"}, Spec: InstanceSpec{ConfigurationName: "cams"}}
	b := a.DeepCopy()
	b.Namespace = "team-b"
	if a.ResourceName() == b.ResourceName() || a.CDIName() == b.CDIName() || ResourceName("team-a", "cams") == ResourceName("team-b", "cams") {
		t.Fatalf("namespaces share %s, %s or the Configuration's resource", a.ResourceName(), a.CDIName())
	}
	if a.LegacyCDIName() != b.LegacyCDIName() {
		t.Fatal("the legacy names are the colliding ones")
	}
	if got := a.ResourceName(); got != "dowse.dev/cams-"+hash+".team-a" {
		t.Fatalf("resource %q", got)
	}
	if got := a.CDIName(); got != "dowse.dev/instance=cams-"+hash+".team-a" {
		t.Fatalf("CDI name %q", got)
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
	if r := ResourceName("default", "debug-echo-a1b2c3"); ValidateResourceName(r) != nil || r != "dowse.dev/debug-echo-a1b2c3.default" {
		t.Fatalf("ResourceName = %q, %v", r, ValidateResourceName(r))
	}
	if err := ValidateResourceName(LegacyResourceName(strings.Repeat("a", 63))); err != nil {
		t.Fatalf("63 characters must be fine: %v", err)
	}
	if err := ValidateResourceName(LegacyResourceName(strings.Repeat("a", 64))); err == nil {
		t.Fatal("64 characters must be refused")
	}
	long := ResourceName("ns", strings.Repeat("a.", 40)+"b")
	if len(long) > len(ResourcePrefix)+maxResourceNameLen || strings.Contains(strings.TrimPrefix(long, ResourcePrefix), ".") {
		t.Fatalf("hashed form %q: want at most 63 characters, without dots", long)
	}
}

func TestHasNode(t *testing.T) {
	inst := &Instance{Status: InstanceStatus{Nodes: []InstanceNode{{Name: "a"}, {Name: "b"}}}}
	if !inst.HasNode("a") || !inst.HasNode("b") || inst.HasNode("c") || (&Instance{}).HasNode("") {
		t.Fatal("HasNode is wrong")
	}
}

func TestEnvName(t *testing.T) {
	for in, want := range map[string]string{
		"DEBUG_ECHO_DESCRIPTION": "DEBUG_ECHO_DESCRIPTION",
		"onvif.ip-address":       "ONVIF_IP_ADDRESS",
		"9lives":                 "_9LIVES",
		"a b=c":                  "A_B_C",
		"ünïcode":                "_N_CODE",
		"":                       "",
		"_x":                     "_X",
	} {
		if got := EnvName(in); got != want {
			t.Errorf("EnvName(%q) = %q, want %q", in, got, want)
		}
	}
}
