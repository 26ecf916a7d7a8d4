package deviceplugin

import (
	"strings"
	"testing"
)

func TestEndpointShort(t *testing.T) {
	e := SocketName(strings.Repeat("n", 253), "dowse.dev/"+strings.Repeat("a", 63))
	if len(DefaultDir)+len(e) > 100 {
		t.Fatalf("socket path too long: %d", len(DefaultDir)+len(e))
	}
}
