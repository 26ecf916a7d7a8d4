package snmpclient

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"unicode/utf8"

	"github.com/gosnmp/gosnmp"
)

func TestNormalizeOID(t *testing.T) {
	for _, c := range [][2]string{{"1.3.6.1.2.1.1.5.0", ".1.3.6.1.2.1.1.5.0"}, {"\t.1.3.6 ", ".1.3.6"}, {"1.3", ".1.3"}} {
		if got, err := NormalizeOID(c[0]); err != nil || got != c[1] {
			t.Errorf("NormalizeOID(%q) = %q, %v; want %q", c[0], got, err, c[1])
		}
	}
	for _, bad := range []string{"", ".", "1", "sysName.0", "1..3", "1.3.4294967296", strings.Repeat("1.", 200) + "1"} {
		if _, err := NormalizeOID(bad); err == nil {
			t.Errorf("NormalizeOID(%q): no error", bad)
		}
	}
	if !HasPrefix(".1.3.6.1.4.1.8072.3", ".1.3.6.1.4.1.8072") || HasPrefix(".1.3.6.1.4.1.80721", ".1.3.6.1.4.1.8072") || !HasPrefix(".1.3", ".1.3") {
		t.Error("HasPrefix does not go arc by arc")
	}
}

func TestText(t *testing.T) {
	for in, want := range map[string]string{"plain": "plain", "a\x00b": "a\uFFFDb", "tab\there": "tab\there", "\xff\xfe": "\uFFFD"} {
		if got := Text([]byte(in)); got != want {
			t.Errorf("Text(%q) = %q, want %q", in, got, want)
		}
	}
	long := Text(strings.Repeat("€", 1000))
	if len(long) > MaxText || !utf8.ValidString(long) {
		t.Errorf("a long value: %d bytes, valid %v", len(long), utf8.ValidString(long))
	}
	if Text(nil) != "" || Text(42) != "42" {
		t.Error("Text of nil or a number")
	}
}

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		err  error
		want error
	}{
		{gosnmp.ErrWrongDigest, ErrAuth},
		{gosnmp.ErrUnknownUsername, ErrAuth},
		{gosnmp.ErrDecryption, ErrAuth},
		{errors.New("incoming packet is not authentic, discarding"), ErrAuth},
		{fmt.Errorf("request timeout (after 0 retries)"), ErrNoAnswer},
		{fmt.Errorf("read: %w", syscall.ECONNREFUSED), ErrNoAnswer},
		{fmt.Errorf("read: %w", syscall.EHOSTUNREACH), ErrNoAnswer},
		{fmt.Errorf("write: %w", syscall.ENETUNREACH), ErrNoAnswer},
		{errors.New("error verifying packet sanity: Got 32 Expected: 32771"), ErrGarbage},
	} {
		if got := Classify(c.err); !errors.Is(got, c.want) {
			t.Errorf("Classify(%v) = %v, want %v", c.err, got, c.want)
		}
	}
	if err := Do(func() error { panic("index out of range") }); !errors.Is(err, ErrGarbage) {
		t.Errorf("Do of a panic = %v", err)
	}
}

func TestCheck(t *testing.T) {
	s := Security{Version: "3", User: "u", AuthPassphrase: "12345678", PrivPassphrase: "12345678", AuthProtocol: "sha-512", PrivProtocol: "aes256c"}
	if err := s.Check(); err != nil || s.Level != AuthPriv || s.AuthProtocol != "SHA512" || s.PrivProtocol != "AES256C" || s.PacketsPerRequest() != 2 {
		t.Errorf("Check = %v, %+v", err, s)
	}
	for _, bad := range []Security{
		{Version: "v2c", User: "u"},
		{Version: "v3", User: strings.Repeat("u", 33)},
		{Version: "v3", User: "u", Level: "authPriv", AuthPassphrase: "12345678"},
		{Version: "v3", User: "u", Level: "noAuthNoPriv", AuthPassphrase: "12345678"},
		{Version: "v3", User: "u", AuthPassphrase: "12345678", AuthProtocol: "SHA3"},
	} {
		if err := bad.Check(); err == nil {
			t.Errorf("Check(%+v): no error", bad)
		}
	}
}
