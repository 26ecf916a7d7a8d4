package handler

import (
	"fmt"
	"math"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// InvalidDetails is the error a Discoverer returns for discovery details it
// cannot accept: InvalidArgument, which the agent shows in the
// Configuration's status and does not retry. The message should name the
// bad field.
func InvalidDetails(format string, args ...any) error {
	return status.Error(codes.InvalidArgument, "discovery_details: "+fmt.Sprintf(format, args...))
}

// ParseDuration reads an optional duration field of discovery details: def
// when s is empty, an InvalidDetails error naming field when s is not a
// duration or is shorter than min.
func ParseDuration(field, s string, def, min time.Duration) (time.Duration, error) {
	if s == "" {
		return def, nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return 0, InvalidDetails("%s: %q is not a duration such as \"10s\"", field, s)
	}
	if v < min {
		return 0, InvalidDetails("%s: %v is shorter than the minimum %v", field, v, min)
	}
	return v, nil
}

// ParseInt reads an optional positive integer field of discovery details
// into v: def when it is 0, an InvalidDetails error naming field when it is
// not between 1 and max.
func ParseInt(field string, v *int, def, max int) error {
	if *v == 0 {
		*v = def
	}
	if *v < 1 || *v > max {
		return InvalidDetails("%s: %d is not between 1 and %d", field, *v, max)
	}
	return nil
}

// PacedConcurrency is the default bound on a scan's probes in flight: a
// silent address holds its slot for the whole timeout, so a scan paced at
// perSecond probes needs perSecond × timeout slots (and one more) for the
// rate, not the slots, to set its speed; at least least, at most most.
func PacedConcurrency(perSecond int, timeout time.Duration, least, most int) int {
	n := int(math.Ceil(float64(perSecond)*timeout.Seconds())) + 1
	return min(max(n, least), most)
}
