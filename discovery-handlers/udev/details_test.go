package udev

import (
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestParseDetails(t *testing.T) {
	d, err := ParseDetails(`
udevRules:
- 'SUBSYSTEM=="video4linux"'
- KERNEL=="null"
groupRecursive: true
`)
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Rules()) != 2 || !d.GroupRecursive || d.Permissions != DefaultPermissions {
		t.Errorf("got %+v", d)
	}
	d, err = ParseDetails(`{"udevRules": ["KERNEL==\"null\""], "permissions": "rw"}`)
	if err != nil || d.Permissions != "rw" {
		t.Errorf("JSON details: %+v, %v", d, err)
	}
}

func TestParseDetailsErrors(t *testing.T) {
	for _, tc := range []struct{ details, want string }{
		{``, "udevRules: at least one rule is required"},
		{`udevRules: []`, "udevRules: at least one rule is required"},
		{`udevRules: ["KERNEL==\"null\""]
groupRecursiv: true`, "groupRecursiv"},
		{`udevRules: "KERNEL==null"`, "udevRules"},
		{`udevRules: ['KERNEL=="null"', 'SUBSYSTEM="tty"']`, `udevRules[1]: column 10: assignments are not allowed`},
		{`udevRules: ['KERNEL=="null"']
permissions: rwx`, `permissions: "rwx" holds 'x'`},
		{`udevRules: ['KERNEL=="null"']
permissions: rr`, `permissions: "rr" repeats 'r'`},
	} {
		_, err := ParseDetails(tc.details)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseDetails(%q) = %v, want InvalidArgument naming %q", tc.details, err, tc.want)
		}
	}
}
