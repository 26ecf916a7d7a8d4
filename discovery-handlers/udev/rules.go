package udev

import (
	"errors"
	"fmt"
	"strings"
)

// Keys a rule may match on. The plural keys (KERNELS, SUBSYSTEMS, DRIVERS,
// ATTRS, TAGS) search the device and its parents, and as in udev all of a
// rule's plural keys must match on the same device.
const (
	KeyKernel     = "KERNEL"
	KeyKernels    = "KERNELS"
	KeySubsystem  = "SUBSYSTEM"
	KeySubsystems = "SUBSYSTEMS"
	KeyDriver     = "DRIVER"
	KeyDrivers    = "DRIVERS"
	KeyAttr       = "ATTR"
	KeyAttrs      = "ATTRS"
	KeyEnv        = "ENV"
	KeyTag        = "TAG"
	KeyTags       = "TAGS"
	KeyDevpath    = "DEVPATH"
)

// keyInfo tells, per key, whether it takes {name} and whether it walks the
// parents.
var keyInfo = map[string]struct{ named, parent bool }{
	KeyKernel:     {false, false},
	KeyKernels:    {false, true},
	KeySubsystem:  {false, false},
	KeySubsystems: {false, true},
	KeyDriver:     {false, false},
	KeyDrivers:    {false, true},
	KeyAttr:       {true, false},
	KeyAttrs:      {true, true},
	KeyEnv:        {true, false},
	KeyTag:        {false, false},
	KeyTags:       {false, true},
	KeyDevpath:    {false, false},
}

// Rule is one parsed rule: a device matches it when every one of its
// matches holds.
type Rule struct {
	// Text is the rule as written.
	Text    string
	Matches []Match
}

// Match is one `KEY{name}=="pattern"` or `KEY{name}!="pattern"` of a rule.
type Match struct {
	Key string
	// Name is the attribute or property name of ATTR{}, ATTRS{} and ENV{}.
	Name string
	// Negate is true for !=.
	Negate  bool
	Pattern Pattern
}

// Parent reports whether the key is matched on the device or one of its
// parents.
func (m Match) Parent() bool { return keyInfo[m.Key].parent }

// ParseError is a rule that cannot be parsed.
type ParseError struct {
	// Rule is the rule's index in udevRules; Column is 1-based, in bytes.
	Rule, Column int
	Msg          string
}

func (e *ParseError) Error() string {
	return fmt.Sprintf("udevRules[%d]: column %d: %s", e.Rule, e.Column, e.Msg)
}

// ParseRule parses one rule in udev's match syntax, e.g.
//
//	SUBSYSTEM=="tty", ATTRS{idVendor}=="0403", KERNEL=="ttyUSB[0-9]*|ttyACM*"
//
// Only match operators (== and !=) are allowed: a discovery rule assigns
// nothing. index is the rule's position, used in errors.
func ParseRule(index int, text string) (Rule, error) {
	r := Rule{Text: text}
	p := &ruleParser{s: text, index: index}
	for {
		p.skipSeparators()
		if p.eof() {
			break
		}
		m, err := p.match()
		if err != nil {
			return Rule{}, err
		}
		r.Matches = append(r.Matches, m)
		p.skipSpace()
		if !p.eof() && p.s[p.i] != ',' {
			return Rule{}, p.errf(p.i, "expected ',' between matches, found %q", p.s[p.i])
		}
	}
	if len(r.Matches) == 0 {
		return Rule{}, p.errf(0, "rule is empty")
	}
	return r, nil
}

type ruleParser struct {
	s     string
	i     int
	index int
}

func (p *ruleParser) eof() bool { return p.i >= len(p.s) }

func (p *ruleParser) errf(at int, format string, args ...any) error {
	return &ParseError{Rule: p.index, Column: at + 1, Msg: fmt.Sprintf(format, args...)}
}

func (p *ruleParser) skipSpace() {
	for !p.eof() && (p.s[p.i] == ' ' || p.s[p.i] == '\t') {
		p.i++
	}
}

func (p *ruleParser) skipSeparators() {
	for !p.eof() && (p.s[p.i] == ' ' || p.s[p.i] == '\t' || p.s[p.i] == ',') {
		p.i++
	}
}

func (p *ruleParser) match() (Match, error) {
	start := p.i
	for !p.eof() && (p.s[p.i] >= 'A' && p.s[p.i] <= 'Z' || p.s[p.i] == '_') {
		p.i++
	}
	key := p.s[start:p.i]
	if key == "" {
		return Match{}, p.errf(start, "expected a key such as KERNEL or ATTRS{name}, found %q", p.s[p.i])
	}
	info, ok := keyInfo[key]
	if !ok {
		return Match{}, p.errf(start, "unknown key %q (want one of KERNEL, KERNELS, SUBSYSTEM, SUBSYSTEMS, DRIVER, DRIVERS, ATTR{}, ATTRS{}, ENV{}, TAG, TAGS, DEVPATH)", key)
	}
	m := Match{Key: key}
	if !p.eof() && p.s[p.i] == '{' {
		if !info.named {
			return Match{}, p.errf(p.i, "%s takes no {name}", key)
		}
		open := p.i
		end := strings.IndexByte(p.s[p.i:], '}')
		if end < 0 {
			return Match{}, p.errf(open, "unclosed '{'")
		}
		m.Name = p.s[p.i+1 : p.i+end]
		if err := checkName(key, m.Name); err != "" {
			return Match{}, p.errf(open+1, "%s", err)
		}
		p.i += end + 1
	} else if info.named {
		return Match{}, p.errf(p.i, "%s needs a {name}", key)
	}
	p.skipSpace()
	opAt := p.i
	switch {
	case strings.HasPrefix(p.s[p.i:], "=="):
	case strings.HasPrefix(p.s[p.i:], "!="):
		m.Negate = true
	case strings.HasPrefix(p.s[p.i:], "+="), strings.HasPrefix(p.s[p.i:], ":="), strings.HasPrefix(p.s[p.i:], "-="), strings.HasPrefix(p.s[p.i:], "="):
		return Match{}, p.errf(opAt, "assignments are not allowed in discovery rules: use == or !=")
	default:
		return Match{}, p.errf(opAt, "expected == or != after %s", key)
	}
	p.i += 2
	p.skipSpace()
	if p.eof() || p.s[p.i] != '"' {
		return Match{}, p.errf(p.i, "expected a double-quoted value")
	}
	valueAt := p.i + 1
	var b strings.Builder
	p.i++
	closed := false
	for !p.eof() {
		c := p.s[p.i]
		if c == '\\' && p.i+1 < len(p.s) && (p.s[p.i+1] == '"' || p.s[p.i+1] == '\\') {
			b.WriteByte(p.s[p.i+1])
			p.i += 2
			continue
		}
		if c == '"' {
			closed = true
			p.i++
			break
		}
		b.WriteByte(c)
		p.i++
	}
	if !closed {
		return Match{}, p.errf(valueAt-1, "unterminated value")
	}
	pat, err := CompilePattern(b.String())
	if err != nil {
		var pe *patternError
		if !errors.As(err, &pe) {
			return Match{}, p.errf(valueAt, "bad pattern: %v", err)
		}
		return Match{}, p.errf(valueAt+pe.at, "bad pattern: %s", pe.msg)
	}
	m.Pattern = pat
	return m, nil
}

func checkName(key, name string) string {
	if name == "" {
		return key + "{} needs a non-empty name"
	}
	if key == KeyEnv {
		if strings.ContainsAny(name, " \t\"=") {
			return fmt.Sprintf("%q is not a property name", name)
		}
		return ""
	}
	// An attribute is a path relative to the device's sysfs directory; it
	// must stay inside it.
	if strings.HasPrefix(name, "/") || strings.ContainsAny(name, " \t\"") {
		return fmt.Sprintf("%q is not a sysfs attribute name", name)
	}
	for _, seg := range strings.Split(name, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Sprintf("%q is not a sysfs attribute name", name)
		}
	}
	return ""
}
