package deviceplugin

import (
	"strings"
	"testing"
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

func TestEndpointShort(t *testing.T) {
	e := SocketName(strings.Repeat("n", 253), "dowse.dev/"+strings.Repeat("a", 63))
	if len(DefaultDir)+len(e) > 100 {
		t.Fatalf("socket path too long: %d", len(DefaultDir)+len(e))
	}
}
