package handler

import (
	"fmt"
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
