package dra

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

func TestPoolsRoundTrip(t *testing.T) {
	for _, shared := range []bool{false, true} {
		inst := &v1alpha1.Instance{
			ObjectMeta: metav1.ObjectMeta{Namespace: "plant", Name: v1alpha1.InstanceName("cams", "0123456789abcdef")},
			Spec:       v1alpha1.InstanceSpec{ConfigurationName: "cams", Shared: shared},
		}
		pool := Pool(inst, "node-1.example")
		if err := ValidPool(pool); err != nil {
			t.Fatal(err)
		}
		dev := Device(inst)
		ns, name, ok := ParseDevice(pool, dev.Name)
		if !ok || ns != "plant" || name != inst.Name {
			t.Errorf("shared=%v: ParseDevice(%q, %q) = %q %q %v", shared, pool, dev.Name, ns, name, ok)
		}
	}
	if _, _, ok := ParseDevice("shared/ns/cfg/aaaa", "bbbb"); ok {
		t.Error("a shared pool's device must be its hash")
	}
	if _, _, ok := ParseDevice("x", "y"); ok {
		t.Error("parsed a pool that is not Dowse's")
	}
}

func TestDeviceClassName(t *testing.T) {
	if got := DeviceClassName("plant", "cams"); got != "cams.plant.dowse.dev" {
		t.Errorf("got %q", got)
	}
	long := DeviceClassName(strings.Repeat("n", 63), strings.Repeat("c", 250))
	if errs := validation.IsDNS1123Subdomain(long); len(errs) > 0 {
		t.Errorf("%q: %v", long, errs)
	}
	if long == DeviceClassName(strings.Repeat("n", 63), strings.Repeat("c", 249)) {
		t.Error("two long names share a class")
	}
}

func TestAttributes(t *testing.T) {
	inst := &v1alpha1.Instance{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cfg-0123456789abcdef"},
		Spec: v1alpha1.InstanceSpec{ConfigurationName: "cfg", Capacity: 3, BrokerProperties: map[string]string{
			"DEBUG_ECHO_DESCRIPTION": "foo1",
			"port":                   "4840",
			"enabled":                "true",
			"1st.value-x":            "1.5",
			"long":                   strings.Repeat("x", 65),
			"configuration":          "not me",
			"":                       "empty",
		}},
	}
	a := Attributes(inst)
	check := func(name string, want string) {
		t.Helper()
		v, ok := a[AttributeName(name)]
		got := "<none>"
		switch {
		case !ok:
		case v.StringValue != nil:
			got = "s:" + *v.StringValue
		case v.IntValue != nil:
			got = "i:" + itoa(*v.IntValue)
		case v.BoolValue != nil:
			got = "b:" + map[bool]string{true: "true", false: "false"}[*v.BoolValue]
		}
		if got != want {
			t.Errorf("%s: got %s, want %s", name, got, want)
		}
	}
	check("DEBUG_ECHO_DESCRIPTION", "s:foo1")
	check("port", "i:4840")
	check("enabled", "b:true")
	check("_1st_value_x", "s:1.5")
	check("long", "<none>")
	check("configuration", "s:cfg")
	check("namespace", "s:ns")
	check("instance", "s:cfg-0123456789abcdef")
	check("shared", "b:false")
	if len(a) != 8 {
		t.Errorf("%d attributes: %v", len(a), a)
	}
	d := Device(inst)
	if c := d.Capacity[CapacitySlots]; c.Value.Value() != 3 || c.RequestPolicy.Default.Value() != 1 {
		t.Errorf("capacity %v", c)
	}
	if AttributeName(strings.Repeat("a", 40)) != AttributeName(strings.Repeat("a", 32)) {
		t.Error("names are cut at 32")
	}
}

func TestAttributesAtMost32(t *testing.T) {
	props := map[string]string{}
	for i := range 50 {
		props["p"+itoa(int64(i))] = "v"
	}
	inst := &v1alpha1.Instance{Spec: v1alpha1.InstanceSpec{ConfigurationName: "c", BrokerProperties: props}}
	if n := len(Device(inst).Attributes) + len(Device(inst).Capacity); n != 32 {
		t.Errorf("%d attributes and capacities", n)
	}
}

func TestSpread(t *testing.T) {
	if c := Spread(nil); len(c) != 1 || len(c[0]) != 0 {
		t.Errorf("empty: %v", c)
	}
	devs := func(n int) []resourceapi.Device {
		out := make([]resourceapi.Device, n)
		for i := range out {
			out[i].Name = v1alpha1.DeviceHash(strconv.Itoa(i), true, "")
		}
		return out
	}
	for _, n := range []int{1, 31, 64, 65, 1000, 5000} {
		got := Spread(devs(n))
		total := 0
		for _, s := range got {
			if len(s) == 0 || len(s) > MaxDevicesPerSlice {
				t.Fatalf("%d devices: a slice of %d", n, len(s))
			}
			total += len(s)
		}
		if total != n {
			t.Fatalf("%d devices spread as %d", n, total)
		}
	}
	// One more device (the bucket count unchanged) changes one slice.
	before, after := Spread(devs(5000)), Spread(devs(5001))
	if len(before) != len(after) {
		t.Fatalf("%d slices, then %d", len(before), len(after))
	}
	changed := 0
	for i := range before {
		if len(before[i]) != len(after[i]) || before[i][0].Name != after[i][0].Name || before[i][len(before[i])-1].Name != after[i][len(after[i])-1].Name {
			changed++
		}
	}
	if changed > 1 {
		t.Errorf("one device more changed %d slices", changed)
	}
	// A bucket that overflows is split.
	same := make([]resourceapi.Device, 200)
	for i := range same {
		same[i].Name = "d"
	}
	if got := Spread(same); len(got) != 4 || len(got[0]) != MaxDevicesPerSlice || len(got[3]) != 200-3*MaxDevicesPerSlice {
		t.Errorf("overflow: %d slices", len(got))
	}
}

func itoa(i int64) string { return strconv.FormatInt(i, 10) }

func TestSettle(t *testing.T) {
	dirty := make(chan struct{}, 1)
	begin := time.Now()
	stop := make(chan struct{})
	go func() {
		for {
			select {
			case <-stop:
				return
			case dirty <- struct{}{}:
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	if !Settle(context.Background(), dirty, 50*time.Millisecond, 300*time.Millisecond) {
		t.Fatal("false")
	}
	close(stop)
	if d := time.Since(begin); d < 300*time.Millisecond || d > 2*time.Second {
		t.Errorf("a burst settled after %s, want about the 300ms maximum", d)
	}
	begin = time.Now()
	Settle(context.Background(), make(chan struct{}), 50*time.Millisecond, time.Second)
	if d := time.Since(begin); d < 50*time.Millisecond || d > 900*time.Millisecond {
		t.Errorf("quiet settled after %s, want about 50ms", d)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Settle(ctx, dirty, time.Second, time.Second) {
		t.Error("true after ctx ended")
	}
}
