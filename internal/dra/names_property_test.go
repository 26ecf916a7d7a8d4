package dra

import (
	"math/rand/v2"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	cdiparser "tags.cncf.io/container-device-interface/pkg/parser"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// genLabel is a random DNS label of n characters (1-63): lower-case
// letters, digits and dashes, starting and ending with a letter or digit,
// digits first as often as letters (Configuration "1cams").
func genLabel(r *rand.Rand, n int) string {
	const alnum = "abcdefghijklmnopqrstuvwxyz0123456789"
	const inner = alnum + "------"
	b := make([]byte, n)
	for i := range b {
		if i == 0 || i == n-1 {
			b[i] = alnum[r.IntN(len(alnum))]
		} else {
			b[i] = inner[r.IntN(len(inner))]
		}
	}
	if r.IntN(2) == 0 {
		b[0] = "0123456789"[r.IntN(10)]
	}
	return string(b)
}

// genSubdomain is a random DNS subdomain of about n characters (at most
// 253): dot-separated labels.
func genSubdomain(r *rand.Rand, n int) string {
	var parts []string
	left := n
	for left > 0 {
		l := min(left, 1+r.IntN(63))
		if r.IntN(3) == 0 {
			l = min(left, 63)
		}
		parts = append(parts, genLabel(r, l))
		left -= l + 1
	}
	return strings.Join(parts, ".")
}

// lengths favours the edges of Kubernetes' limits.
func genLen(r *rand.Rand, limit int) int {
	edges := []int{1, 2, 45, 46, 47, 62, 63, 64, 65, 127, 252, 253}
	if r.IntN(2) == 0 {
		if l := edges[r.IntN(len(edges))]; l <= limit {
			return l
		}
	}
	return 1 + r.IntN(limit)
}

// checkDerivedNames checks every name derived from a namespace,
// Configuration and node against the validators of the API server's
// libraries (apimachinery) and of the CDI library, and the round trips.
func checkDerivedNames(t *testing.T, ns, cfg, node string) {
	t.Helper()
	if validation.IsDNS1123Label(ns) != nil || validation.IsDNS1123Subdomain(cfg) != nil || validation.IsDNS1123Subdomain(node) != nil {
		t.Fatalf("generator made an invalid name: %q %q %q", ns, cfg, node)
	}
	for _, shared := range []bool{false, true} {
		hash := v1alpha1.DeviceHash("dev", shared, node)
		inst := &v1alpha1.Instance{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: v1alpha1.InstanceName(cfg, hash)},
			Spec: v1alpha1.InstanceSpec{ConfigurationName: cfg, Shared: shared, Capacity: 2}}
		fail := func(what, name string, errs any) {
			t.Helper()
			t.Errorf("namespace %q, Configuration %q, node %q: %s %q: %v", ns, cfg, node, what, name, errs)
		}
		if errs := validation.IsDNS1123Subdomain(inst.Name); len(errs) > 0 || len(inst.Name) > 63 {
			fail("Instance name", inst.Name, errs)
		}
		for _, res := range []string{inst.ResourceName(), v1alpha1.ResourceName(ns, cfg)} {
			if errs := validation.IsQualifiedName(res); len(errs) > 0 {
				fail("extended resource", res, errs)
			}
		}
		if gotNS, got, ok := v1alpha1.ParseResourceName(inst.ResourceName()); ok && (gotNS != ns || got != inst.Name) {
			fail("resource reads back as "+gotNS+"/"+got, inst.ResourceName(), nil)
		}
		vendor, class, dev, err := cdiparser.ParseQualifiedName(inst.CDIName())
		if err != nil || vendor+"/"+class != v1alpha1.CDIKind {
			fail("CDI device", inst.CDIName(), err)
		}
		if err := cdiparser.ValidateDeviceName(dev); err != nil {
			fail("CDI device name", dev, err)
		}
		if gotNS, got, ok := v1alpha1.ParseCDIName(inst.CDIName()); !ok || gotNS != ns || got != inst.Name {
			fail("CDI device reads back as "+gotNS+"/"+got, inst.CDIName(), ok)
		}
		if errs := validation.IsDNS1123Subdomain(DeviceClassName(ns, cfg)); len(errs) > 0 {
			fail("DeviceClass", DeviceClassName(ns, cfg), errs)
		}
		pool := Pool(inst, node)
		if err := ValidPool(pool); err != nil {
			fail("pool", pool, err)
		}
		d := Device(inst)
		if errs := validation.IsDNS1123Label(d.Name); len(errs) > 0 {
			fail("DRA device", d.Name, errs)
		}
		for name, a := range d.Attributes {
			if a.StringValue != nil && len(*a.StringValue) > resourceapi.DeviceAttributeMaxValueLength {
				fail("attribute "+string(name), *a.StringValue, "longer than 64")
			}
		}
		if gotNS, got, ok := ParseDevice(pool, d.Name); !ok || gotNS != ns || got != inst.Name {
			fail("DRA device reads back as "+gotNS+"/"+got, pool+" "+d.Name, ok)
		}
	}
}

// TestEveryValidNameGivesValidDerivedNames: for any valid namespace,
// Configuration and node name (generated, favouring the limits' edges and
// names that start with a digit), every derived name passes apimachinery's
// and the CDI library's own validation and reads back.
func TestEveryValidNameGivesValidDerivedNames(t *testing.T) {
	checkDerivedNames(t, "default", "1cams", "node-a")
	checkDerivedNames(t, strings.Repeat("n", 63), strings.Repeat("c", 253), strings.Repeat("d", 253))
	r := rand.New(rand.NewPCG(27, 1))
	for range 5000 {
		checkDerivedNames(t, genLabel(r, genLen(r, 63)), genSubdomain(r, genLen(r, 253)), genSubdomain(r, genLen(r, 253)))
		if t.Failed() {
			return
		}
	}
}

// FuzzDerivedNames is TestEveryValidNameGivesValidDerivedNames over
// fuzzed names: any input that is a valid namespace, Configuration and
// node name.
func FuzzDerivedNames(f *testing.F) {
	f.Add("default", "1cams", "node-a")
	f.Add("n", strings.Repeat("a.", 126)+"b", "x")
	f.Fuzz(func(t *testing.T, ns, cfg, node string) {
		if validation.IsDNS1123Label(ns) != nil || validation.IsDNS1123Subdomain(cfg) != nil || validation.IsDNS1123Subdomain(node) != nil {
			t.Skip()
		}
		checkDerivedNames(t, ns, cfg, node)
	})
}
