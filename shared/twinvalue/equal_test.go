package twinvalue

import "testing"

func TestEqual(t *testing.T) {
	for _, tc := range []struct {
		a, b string
		want bool
	}{
		{"21", "21", true}, {"1.50", "1.5", true}, {"21", " 21.0", true}, {"1e3", "1000", true},
		{"on", "on", true}, {"on", "off", false}, {"21", "22", false}, {"", "0", false}, {"NaN", "NaN", true},
	} {
		if got := Equal(tc.a, tc.b); got != tc.want {
			t.Errorf("Equal(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
	}
}
