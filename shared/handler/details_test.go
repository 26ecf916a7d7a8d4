package handler

import (
	"testing"
	"time"
)

func TestPacedConcurrency(t *testing.T) {
	for _, tc := range []struct {
		perSecond   int
		timeout     time.Duration
		least, most int
		want        int
	}{
		// A silent address holds its slot for the timeout: at 50 a
		// second and 1 s each, 51 slots keep the rate the limit.
		{50, time.Second, 16, 256, 51},
		{100, time.Second, 16, 256, 101},
		{500, 300 * time.Millisecond, 16, 256, 151},
		{10, 100 * time.Millisecond, 16, 256, 16},
		{1000, 10 * time.Second, 16, 256, 256},
	} {
		if got := PacedConcurrency(tc.perSecond, tc.timeout, tc.least, tc.most); got != tc.want {
			t.Errorf("PacedConcurrency(%d, %v, %d, %d) = %d, want %d", tc.perSecond, tc.timeout, tc.least, tc.most, got, tc.want)
		}
	}
}

func TestParseInt(t *testing.T) {
	v := 0
	if err := ParseInt("concurrency", &v, 7, 10); err != nil || v != 7 {
		t.Errorf("unset: %d, %v; want the default 7", v, err)
	}
	v = 11
	if err := ParseInt("concurrency", &v, 7, 10); err == nil || err.Error() != "rpc error: code = InvalidArgument desc = discovery_details: concurrency: 11 is not between 1 and 10" {
		t.Errorf("over the bound: %v", err)
	}
	v = -1
	if err := ParseInt("concurrency", &v, 7, 10); err == nil {
		t.Error("a negative value was accepted")
	}
}
