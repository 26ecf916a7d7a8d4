package deviceplugin

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

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

func TestSlotIDs(t *testing.T) {
	inst := &v1alpha1.Instance{ObjectMeta: metav1.ObjectMeta{Name: "debug-echo-a1b2c3"}, Spec: v1alpha1.InstanceSpec{Capacity: 3}}
	got := strings.Join(SlotIDs(inst), ",")
	if got != "a1b2c3-0,a1b2c3-1,a1b2c3-2" {
		t.Fatalf("SlotIDs = %s", got)
	}
	inst.Spec.Capacity = 0
	if got := SlotIDs(inst); len(got) != 1 {
		t.Fatalf("capacity 0 gives %v, want one slot", got)
	}
	if h := InstanceHash("nohash"); h != "nohash" {
		t.Fatalf("InstanceHash without '-' = %q", h)
	}
}

func TestResourceName(t *testing.T) {
	if r, err := ResourceName("debug-echo-a1b2c3"); err != nil || r != "dowse.dev/debug-echo-a1b2c3" {
		t.Fatalf("ResourceName = %q, %v", r, err)
	}
	if _, err := ResourceName(strings.Repeat("a", 63)); err != nil {
		t.Fatalf("63 characters must be fine: %v", err)
	}
	if _, err := ResourceName(strings.Repeat("a", 64)); err == nil {
		t.Fatal("64 characters must be refused")
	}
}

func TestEndpointShort(t *testing.T) {
	e := SocketName(strings.Repeat("n", 253), "dowse.dev/"+strings.Repeat("a", 63))
	if len(DefaultDir)+len(e) > 100 {
		t.Fatalf("socket path too long: %d", len(DefaultDir)+len(e))
	}
}
