package udev

import (
	"errors"
	"strings"
	"testing"
)

func TestParseRule(t *testing.T) {
	r, err := ParseRule(0, ` SUBSYSTEM=="tty",ATTRS{idVendor}!="0403" , ENV{ID_SERIAL}=="a\"b\\c*", KERNEL=="ttyUSB*|ttyACM*"`)
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		key, name, pattern string
		negate, parent     bool
	}{
		{"SUBSYSTEM", "", "tty", false, false},
		{"ATTRS", "idVendor", "0403", true, true},
		{"ENV", "ID_SERIAL", `a"b\c*`, false, false},
		{"KERNEL", "", "ttyUSB*|ttyACM*", false, false},
	}
	if len(r.Matches) != len(want) {
		t.Fatalf("got %d matches, want %d: %+v", len(r.Matches), len(want), r.Matches)
	}
	for i, w := range want {
		m := r.Matches[i]
		if m.Key != w.key || m.Name != w.name || m.Pattern.String() != w.pattern || m.Negate != w.negate || m.Parent() != w.parent {
			t.Errorf("match %d = %+v (pattern %q), want %+v", i, m, m.Pattern.String(), w)
		}
	}
}

func TestParseRuleErrors(t *testing.T) {
	for _, tc := range []struct {
		rule   string
		column int
		msg    string
	}{
		{``, 1, "rule is empty"},
		{` , `, 1, "rule is empty"},
		{`kernel=="x"`, 1, "expected a key"},
		{`NAME=="x"`, 1, `unknown key "NAME"`},
		{`KERNEL="x"`, 7, "assignments are not allowed"},
		{`KERNEL:="x"`, 7, "assignments are not allowed"},
		{`KERNEL+="x"`, 7, "assignments are not allowed"},
		{`KERNEL<"x"`, 7, "expected == or !="},
		{`KERNEL==x`, 9, "expected a double-quoted value"},
		{`KERNEL=="x`, 9, "unterminated value"},
		{`SUBSYSTEM=="tty", KERNEL=="ttyUSB[0-9"`, 34, "unclosed '['"},
		{`KERNEL=="a" SUBSYSTEM=="b"`, 13, "expected ','"},
		{`ATTR=="x"`, 5, "ATTR needs a {name}"},
		{`ATTRS{}=="x"`, 7, "ATTRS{} needs a non-empty name"},
		{`ATTR{../../etc/passwd}=="x"`, 6, "not a sysfs attribute name"},
		{`ATTR{/etc/passwd}=="x"`, 6, "not a sysfs attribute name"},
		{`ATTR{idVendor=="x"`, 5, "unclosed '{'"},
		{`KERNEL{x}=="x"`, 7, "KERNEL takes no {name}"},
		{`ENV{A B}=="x"`, 5, "not a property name"},
	} {
		_, err := ParseRule(3, tc.rule)
		var pe *ParseError
		if !errors.As(err, &pe) {
			t.Errorf("ParseRule(%q) = %v, want a ParseError", tc.rule, err)
			continue
		}
		if pe.Rule != 3 || pe.Column != tc.column || !strings.Contains(pe.Msg, tc.msg) {
			t.Errorf("ParseRule(%q) = %v, want rule 3, column %d, %q", tc.rule, err, tc.column, tc.msg)
		}
	}
}
