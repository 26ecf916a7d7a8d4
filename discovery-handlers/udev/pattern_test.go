package udev

import "testing"

func TestPattern(t *testing.T) {
	for _, tc := range []struct {
		pattern, value string
		want           bool
	}{
		{"null", "null", true},
		{"null", "nul", false},
		{"", "", true},
		{"", "x", false},
		{"*", "", true},
		{"*", "a/b/c", true}, // '*' crosses '/', as fnmatch without FNM_PATHNAME
		{"/devices/*/net/*", "/devices/virtual/net/veth0", true},
		{"tty?", "tty1", true},
		{"tty?", "tty", false},
		{"tty?", "tty12", false},
		{"ttyUSB[0-9]*", "ttyUSB12", true},
		{"ttyUSB[0-9]*", "ttyUSBx", false},
		{"video[!0]", "video1", true},
		{"video[!0]", "video0", false},
		{"video[^0]", "video0", false},
		{"[]x]", "]", true},
		{"[a-cx]", "x", true},
		{"[a-cx]", "d", false},
		{"ttyUSB*|ttyACM*", "ttyACM0", true},
		{"ttyUSB*|ttyACM*", "ttyS0", false},
		{"a|", "", true},
		{"*a*b*c", "xxaxxbxxc", true},
		{"*a*b*c", "xxaxxbxxcx", false},
		{"loop*", "loop-control", true},
	} {
		p, err := CompilePattern(tc.pattern)
		if err != nil {
			t.Fatalf("CompilePattern(%q): %v", tc.pattern, err)
		}
		if got := p.Match(tc.value); got != tc.want {
			t.Errorf("%q.Match(%q) = %v, want %v", tc.pattern, tc.value, got, tc.want)
		}
	}
}

func TestPatternErrors(t *testing.T) {
	for _, s := range []string{"[abc", "video[0-9", "a|[b"} {
		if _, err := CompilePattern(s); err == nil {
			t.Errorf("CompilePattern(%q) = nil error, want unclosed '['", s)
		}
	}
}
