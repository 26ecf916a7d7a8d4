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

func TestCanonical(t *testing.T) {
	for _, tc := range []struct {
		t        Type
		in, want string
	}{
		{Int, " 21 ", "21"}, {"integer", "-0", "0"}, {Double, "1.50", "1.5"}, {Double, "1e21", "1e+21"},
		{Float, "0.1", "0.1"}, {Float, "0.123456789", "0.123456789"}, {Boolean, "TRUE", "true"}, {"bool", "0", "false"},
		{Bytes, " AQI= ", "AQI="}, {String, " on ", " on "}, {"", "x", "x"},
	} {
		got, err := Canonical(tc.t, tc.in)
		if err != nil || got != tc.want {
			t.Errorf("Canonical(%s, %q) = %q, %v; want %q", tc.t, tc.in, got, err, tc.want)
		}
		if again, err := Canonical(tc.t, got); err != nil || again != got {
			t.Errorf("Canonical(%s, %q) = %q, %v; want it unchanged", tc.t, got, again, err)
		}
	}
	for _, tc := range []struct {
		t  Type
		in string
	}{{Int, "1.5"}, {Float, "1e39"}, {Double, "NaN"}, {Boolean, "yes"}, {Bytes, "%%"}, {String, "\xff"}, {"COMPLEX", "1"}} {
		if got, err := Canonical(tc.t, tc.in); err == nil {
			t.Errorf("Canonical(%s, %q) = %q, want an error", tc.t, tc.in, got)
		}
	}
}
