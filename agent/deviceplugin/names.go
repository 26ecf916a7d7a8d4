// Package deviceplugin serves the kubelet device plugins that let pods ask
// for Dowse devices: one plugin per Instance on this node
// (dowse.dev/<instance>) and one per Configuration
// (dowse.dev/<configuration>), each offering one device per capacity slot,
// and writes a CDI spec per Instance for the container runtime. The names
// they use (resources, slot ids, CDI kinds and devices) are v1alpha1's.
//
// The lifecycle of a plugin (serve the socket, register with the kubelet,
// serve and register again when the kubelet restarts) is the Plugin type;
// what the plugin offers and answers is a separate gRPC service, so that
// both can be tested alone.
package deviceplugin

import (
	"strings"
)

// EnvName makes s a valid, conventional environment variable name:
// upper case, every character outside [A-Z0-9_] replaced by '_', and a
// leading '_' when it would start with a digit. An empty s gives "".
func EnvName(s string) string {
	if s == "" {
		return ""
	}
	var b strings.Builder
	if s[0] >= '0' && s[0] <= '9' {
		b.WriteByte('_')
	}
	for _, r := range strings.ToUpper(s) {
		switch {
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '_':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}
