// Package snmpclient is what the SNMP discovery handler and the SNMP mapper
// share about speaking to an agent: the security settings (version,
// community, USM user and protocols) and how they become a gosnmp client,
// the sorting of gosnmp's errors into refused credentials, garbage and
// silence, and the bounding of what an agent answers. Both ends build
// their clients here, so that an agent the handler found with some
// credentials is reached by the mapper with the same meaning of them.
package snmpclient

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gosnmp/gosnmp"
)

// Versions.
const (
	V1  = "v1"
	V2c = "v2c"
	V3  = "v3"
)

// Security levels of SNMPv3.
const (
	NoAuthNoPriv = "noAuthNoPriv"
	AuthNoPriv   = "authNoPriv"
	AuthPriv     = "authPriv"
)

// DefaultCommunity is the community of v1 and v2c when none is given: the
// read-only community most agents ship with.
const DefaultCommunity = "public"

// MaxText bounds a text value taken from an agent, in bytes (SNMPv2-MIB's
// DisplayString is 0..255).
const MaxText = 255

var authProtocols = map[string]gosnmp.SnmpV3AuthProtocol{
	"MD5": gosnmp.MD5, "SHA": gosnmp.SHA, "SHA224": gosnmp.SHA224, "SHA256": gosnmp.SHA256,
	"SHA384": gosnmp.SHA384, "SHA512": gosnmp.SHA512,
}

var privProtocols = map[string]gosnmp.SnmpV3PrivProtocol{
	"DES": gosnmp.DES, "AES": gosnmp.AES, "AES192": gosnmp.AES192, "AES256": gosnmp.AES256,
	"AES192C": gosnmp.AES192C, "AES256C": gosnmp.AES256C,
}

// Security is how to speak to an agent.
type Security struct {
	// Version is v1, v2c (the default) or v3.
	Version string
	// Community of v1 and v2c; DefaultCommunity when empty.
	Community string
	// User is the SNMPv3 USM user name.
	User string
	// Level is noAuthNoPriv, authNoPriv or authPriv. Default: authPriv
	// with a privacy passphrase, authNoPriv with an authentication one
	// alone, else noAuthNoPriv.
	Level string
	// AuthProtocol is MD5, SHA (default), SHA224, SHA256, SHA384 or SHA512.
	AuthProtocol string
	// PrivProtocol is DES, AES (default), AES192, AES256, AES192C or
	// AES256C (the C ones: Cisco's key extension).
	PrivProtocol   string
	AuthPassphrase string
	PrivPassphrase string
	// ContextName is the SNMPv3 context, "" for the default.
	ContextName string
}

// Check fills in defaults and says what is wrong, naming the setting.
// What is given but unused (a user for v2c) is an error too, so that a
// Configuration that means v3 and forgot to say so is told.
func (s *Security) Check() error {
	switch strings.ToLower(s.Version) {
	case "", "2c", V2c, "2":
		s.Version = V2c
	case V1, "1":
		s.Version = V1
	case V3, "3":
		s.Version = V3
	default:
		return fmt.Errorf("version %q: want v1, v2c or v3", s.Version)
	}
	if s.Version != V3 {
		if s.User != "" || s.AuthPassphrase != "" || s.PrivPassphrase != "" || s.Level != "" {
			return fmt.Errorf("a v3 user, level or passphrase is given but the version is %s (set version: v3)", s.Version)
		}
		if s.Community == "" {
			s.Community = DefaultCommunity
		}
		return nil
	}
	if s.Community != "" {
		return errors.New("a community is given but the version is v3, which uses a user instead")
	}
	if s.User == "" {
		return errors.New("v3 needs a user name")
	}
	if len(s.User) > 32 {
		return fmt.Errorf("user name %q is longer than 32 bytes (RFC 3414)", s.User)
	}
	if s.Level == "" {
		switch {
		case s.PrivPassphrase != "":
			s.Level = AuthPriv
		case s.AuthPassphrase != "":
			s.Level = AuthNoPriv
		default:
			s.Level = NoAuthNoPriv
		}
	}
	switch strings.ToLower(s.Level) {
	case strings.ToLower(NoAuthNoPriv):
		s.Level = NoAuthNoPriv
	case strings.ToLower(AuthNoPriv):
		s.Level = AuthNoPriv
	case strings.ToLower(AuthPriv):
		s.Level = AuthPriv
	default:
		return fmt.Errorf("securityLevel %q: want noAuthNoPriv, authNoPriv or authPriv", s.Level)
	}
	s.AuthProtocol = strings.ToUpper(strings.ReplaceAll(s.AuthProtocol, "-", ""))
	s.PrivProtocol = strings.ToUpper(strings.ReplaceAll(s.PrivProtocol, "-", ""))
	if s.Level == NoAuthNoPriv {
		if s.AuthPassphrase != "" || s.PrivPassphrase != "" {
			return errors.New("securityLevel noAuthNoPriv takes no passphrase")
		}
		return nil
	}
	if s.AuthProtocol == "" {
		s.AuthProtocol = "SHA"
	}
	if _, ok := authProtocols[s.AuthProtocol]; !ok {
		return fmt.Errorf("authProtocol %q: want MD5, SHA, SHA224, SHA256, SHA384 or SHA512", s.AuthProtocol)
	}
	// RFC 3414 (11.2): a passphrase has at least 8 characters; agents
	// refuse shorter ones, which would look like a wrong password.
	if len(s.AuthPassphrase) < 8 {
		return fmt.Errorf("securityLevel %s needs an authentication passphrase of at least 8 characters", s.Level)
	}
	if s.Level == AuthNoPriv {
		if s.PrivPassphrase != "" {
			return errors.New("securityLevel authNoPriv takes no privacy passphrase")
		}
		return nil
	}
	if s.PrivProtocol == "" {
		s.PrivProtocol = "AES"
	}
	if _, ok := privProtocols[s.PrivProtocol]; !ok {
		return fmt.Errorf("privProtocol %q: want DES, AES, AES192, AES256, AES192C or AES256C", s.PrivProtocol)
	}
	if len(s.PrivPassphrase) < 8 {
		return errors.New("securityLevel authPriv needs a privacy passphrase of at least 8 characters")
	}
	return nil
}

// PacketsPerRequest is how many packets one request costs on the wire
// before any retry: two for v3 (the engine discovery, then the request).
func (s *Security) PacketsPerRequest() int {
	if s.Version == V3 {
		return 2
	}
	return 1
}

// New returns a client of the agent at host:port, not yet connected, with
// no retries (callers decide when to ask again). ctx bounds its requests.
// s must have passed Check.
func New(ctx context.Context, host string, port int, s *Security, timeout time.Duration) *gosnmp.GoSNMP {
	g := &gosnmp.GoSNMP{
		Context:   ctx,
		Target:    host,
		Port:      uint16(port),
		Transport: "udp",
		Timeout:   timeout,
		Retries:   0,
		MaxOids:   gosnmp.MaxOids,
	}
	switch s.Version {
	case V1:
		g.Version, g.Community = gosnmp.Version1, s.Community
	case V2c:
		g.Version, g.Community = gosnmp.Version2c, s.Community
	case V3:
		g.Version = gosnmp.Version3
		g.SecurityModel = gosnmp.UserSecurityModel
		g.ContextName = s.ContextName
		usm := &gosnmp.UsmSecurityParameters{UserName: s.User}
		switch s.Level {
		case NoAuthNoPriv:
			g.MsgFlags = gosnmp.NoAuthNoPriv
		case AuthNoPriv:
			g.MsgFlags = gosnmp.AuthNoPriv
			usm.AuthenticationProtocol, usm.AuthenticationPassphrase = authProtocols[s.AuthProtocol], s.AuthPassphrase
		case AuthPriv:
			g.MsgFlags = gosnmp.AuthPriv
			usm.AuthenticationProtocol, usm.AuthenticationPassphrase = authProtocols[s.AuthProtocol], s.AuthPassphrase
			usm.PrivacyProtocol, usm.PrivacyPassphrase = privProtocols[s.PrivProtocol], s.PrivPassphrase
		}
		g.SecurityParameters = usm
	}
	return g
}

// ErrAuth says the agent refused the credentials: an unknown user, a wrong
// authentication or privacy passphrase, a security level it does not
// allow. (v1 and v2c agents drop requests with a wrong community without
// a word: that is silence, not ErrAuth.)
var ErrAuth = errors.New("the agent refused the credentials")

// ErrGarbage says the agent answered with something that is not a usable
// SNMP response.
var ErrGarbage = errors.New("the answer is not a usable SNMP response")

// ErrNoAnswer says nothing came back in time (or the port is closed).
var ErrNoAnswer = errors.New("no answer")

// Classify wraps a gosnmp error as ErrAuth, ErrNoAnswer or ErrGarbage
// (anything else that failed after a packet came back), keeping its words.
func Classify(err error) error {
	if err == nil {
		return nil
	}
	switch {
	case errors.Is(err, ErrAuth), errors.Is(err, ErrGarbage), errors.Is(err, ErrNoAnswer):
		return err
	case errors.Is(err, gosnmp.ErrUnknownUsername):
		return fmt.Errorf("%w: unknown user name (%w)", ErrAuth, err)
	case errors.Is(err, gosnmp.ErrWrongDigest):
		return fmt.Errorf("%w: wrong authentication passphrase or protocol (%w)", ErrAuth, err)
	case errors.Is(err, gosnmp.ErrDecryption):
		return fmt.Errorf("%w: wrong privacy passphrase or protocol (%w)", ErrAuth, err)
	case errors.Is(err, gosnmp.ErrUnknownSecurityLevel):
		return fmt.Errorf("%w: the user may not use this security level (%w)", ErrAuth, err)
	case strings.Contains(err.Error(), "not authentic"):
		// An agent answers an unknown user or a wrong digest with an
		// unauthenticated report, which gosnmp refuses before reading it.
		return fmt.Errorf("%w: its answer fails authentication with these settings: an unknown user, or a wrong authentication passphrase or protocol (%w)", ErrAuth, err)
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	var ne net.Error
	// A host that is not there: no answer to the neighbour lookup
	// (EHOSTUNREACH, once a timeout outlasts the kernel's tries) or no
	// route at all.
	if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, os.ErrDeadlineExceeded) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) ||
		strings.Contains(err.Error(), "request timeout") || strings.Contains(err.Error(), "connection refused") {
		return fmt.Errorf("%w: %w", ErrNoAnswer, err)
	}
	return fmt.Errorf("%w: %w", ErrGarbage, err)
}

// Do runs f, turning a panic in gosnmp's decoding of an agent's answer into
// an ErrGarbage error: one agent's bytes must not end the process.
func Do(f func() error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: the decoder failed on it: %v", ErrGarbage, r)
		}
	}()
	return f()
}

// Text returns an agent's value as bounded, printable UTF-8: invalid bytes
// and control characters become U+FFFD, and it is cut to MaxText bytes on
// a rune boundary.
func Text(v any) string {
	var s string
	switch x := v.(type) {
	case []byte:
		s = string(x)
	case string:
		s = x
	case nil:
		return ""
	default:
		s = fmt.Sprint(x)
	}
	if len(s) > 4*MaxText {
		s = s[:4*MaxText]
	}
	s = strings.Map(func(r rune) rune {
		if r == utf8.RuneError || (unicode.IsControl(r) && r != '\t') {
			return utf8.RuneError
		}
		return r
	}, strings.ToValidUTF8(s, string(utf8.RuneError)))
	if len(s) > MaxText {
		cut := MaxText
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	return s
}

// NormalizeOID checks a dotted OID and returns it with a leading dot, as
// gosnmp writes them: "1.3.6.1.2.1.1.5.0" and ".1.3.6.1.2.1.1.5.0" are the
// same object.
func NormalizeOID(s string) (string, error) {
	t := strings.TrimPrefix(strings.TrimSpace(s), ".")
	if t == "" {
		return "", fmt.Errorf("OID %q is empty", s)
	}
	arcs := strings.Split(t, ".")
	if len(arcs) < 2 || len(arcs) > 128 {
		return "", fmt.Errorf("OID %q: want 2 to 128 numeric arcs such as 1.3.6.1.2.1.1.5.0", s)
	}
	for _, a := range arcs {
		if _, err := strconv.ParseUint(a, 10, 32); err != nil {
			return "", fmt.Errorf("OID %q: arc %q is not a number below 2^32 (names such as sysName.0 need a MIB; give the numeric OID)", s, a)
		}
	}
	return "." + t, nil
}

// HasPrefix says whether oid lies under prefix, arc by arc (both
// normalized): .1.3.6.1.4.1.8072 holds .1.3.6.1.4.1.8072.3.2.10 but not
// .1.3.6.1.4.1.80721.
func HasPrefix(oid, prefix string) bool {
	return oid == prefix || strings.HasPrefix(oid, prefix+".")
}
