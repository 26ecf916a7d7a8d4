package dra

import (
	"context"
	"hash/fnv"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

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

func TestBuckets(t *testing.T) {
	names := func(n int) []string {
		out := make([]string, n)
		for i := range out {
			out[i] = v1alpha1.DeviceHash(strconv.Itoa(i), true, "")
		}
		return out
	}
	for _, n := range []int{0, 1, 32, 33, 1000, 5000} {
		count, of := Buckets(names(n), 0)
		if count&(count-1) != 0 || count*spreadTarget < n || (count > 1 && count*spreadTarget/2 >= n) {
			t.Fatalf("%d devices: %d slices", n, count)
		}
		per := make([]int, count)
		for _, b := range of {
			per[b]++
		}
		if m := slices.Max(append(per, 0)); m > MaxDevicesPerSlice {
			t.Fatalf("%d devices: a slice of %d", n, m)
		}
	}
	// One more device (the slice count unchanged) leaves every other
	// device in its slice.
	_, before := Buckets(names(5000), 0)
	_, after := Buckets(names(5001), 0)
	if !slices.Equal(before, after[:5000]) {
		t.Error("one device more moved others")
	}
	// 129 names that share a slice among 8 make 16 slices.
	var same []string
	for i := 0; len(same) < MaxDevicesPerSlice+1; i++ {
		h := fnv.New32a()
		h.Write([]byte("d" + strconv.Itoa(i)))
		if h.Sum32()%8 == 0 {
			same = append(same, "d"+strconv.Itoa(i))
		}
	}
	if count, _ := Buckets(same, 0); count != 16 {
		t.Errorf("overflow: %d slices, want 16", count)
	}
}

// TestBucketsHysteresis: a pool hovering at 4,096 devices keeps its slice
// count (and so every device's slice) across each crossing; it shrinks
// once the pool fits a quarter of its slices.
func TestBucketsHysteresis(t *testing.T) {
	names := make([]string, 4097)
	for i := range names {
		names[i] = v1alpha1.DeviceHash(strconv.Itoa(i), true, "")
	}
	have, _ := Buckets(names[:4096], 0)
	if have != 128 {
		t.Fatalf("4,096 devices in %d slices, want 128", have)
	}
	have, at4097 := Buckets(names, have)
	if have != 256 {
		t.Fatalf("4,097 devices in %d slices, want 256", have)
	}
	for round := range 10 {
		n := 4096 + round%2
		count, of := Buckets(names[:n], have)
		if count != 256 || !slices.Equal(of, at4097[:n]) {
			t.Fatalf("round %d, %d devices: %d slices: the count must stay 256 and no device move", round, n, count)
		}
		have = count
	}
	if count, _ := Buckets(names[:2049], 256); count != 256 {
		t.Errorf("2,049 devices in %d slices, want 256 kept", count)
	}
	if count, _ := Buckets(names[:2048], 256); count != 64 {
		t.Errorf("2,048 devices in %d slices, want 64 (a quarter of 256 fits them)", count)
	}
	if count, _ := Buckets(names[:100], 3); count != 4 {
		t.Errorf("a count that is no power of two is not kept: %d slices", count)
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
