package twinvalue

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Metadata keys of a twin value. KubeEdge's mappers put MetaTimestamp and
// MetaType on a reported value; Dowse's mappers add MetaError when the last
// read of the property failed (the value is then the last good one) and
// MetaDesiredError when the last desired value could not be applied
// (observedDesired then stays the last value applied). Both go away with
// the next good read or write.
const (
	// MetaTimestamp is when the value was read, in Unix milliseconds
	// (Timestamp, TimestampOf).
	MetaTimestamp = "timestamp"
	// MetaType is the property's type as the mapper read it.
	MetaType         = "type"
	MetaError        = "error"
	MetaDesiredError = "desiredError"
)

// Timestamp is t as MetaTimestamp holds it.
func Timestamp(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

// TimestampOf reads md's MetaTimestamp; ok is false when it is missing or
// not a positive number of milliseconds.
func TimestampOf(md map[string]string) (t time.Time, ok bool) {
	ms, err := strconv.ParseInt(md[MetaTimestamp], 10, 64)
	if err != nil || ms <= 0 {
		return time.Time{}, false
	}
	return time.UnixMilli(ms), true
}

// Device states a mapper reports (DMI's ReportDeviceStates): KubeEdge's,
// and mapper-framework's own StateDisconnected, which edgecore drops.
const (
	StateOK           = "ok"
	StateOnline       = "online"
	StateOffline      = "offline"
	StateUnhealthy    = "unhealthy"
	StateUnknown      = "unknown"
	StateDisconnected = "disconnected"
)

// States returns every state, in the order above.
func States() []string {
	return []string{StateOK, StateOnline, StateOffline, StateUnhealthy, StateUnknown, StateDisconnected}
}

// ParseState reads a reported state case-insensitively, ignoring
// surrounding whitespace.
func ParseState(s string) (string, error) {
	st := strings.ToLower(strings.TrimSpace(s))
	switch st {
	case StateOK, StateOnline, StateOffline, StateUnhealthy, StateUnknown, StateDisconnected:
		return st, nil
	}
	return "", fmt.Errorf("state %q is not one of %s", s, strings.Join(States(), ", "))
}

// Online says whether a device in state s is reachable (ok or online).
func Online(s string) bool { return s == StateOK || s == StateOnline }
