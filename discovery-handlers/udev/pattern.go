package udev

import "fmt"

// Pattern is a udev match pattern: alternatives separated by '|', each a
// glob where '*' matches any string (including '/'), '?' any one byte and
// '[...]' one byte of a set (ranges a-z, negated by a leading '!' or '^').
// An empty pattern matches only the empty string, as in udev.
type Pattern struct {
	text string
	alts []string
}

// String returns the pattern as written.
func (p Pattern) String() string { return p.text }

type patternError struct {
	at  int
	msg string
}

func (e *patternError) Error() string { return fmt.Sprintf("at %d: %s", e.at, e.msg) }

// CompilePattern checks a pattern and returns it ready to match.
func CompilePattern(s string) (Pattern, error) {
	p := Pattern{text: s}
	start := 0
	for i := 0; i <= len(s); i++ {
		if i == len(s) || s[i] == '|' {
			p.alts = append(p.alts, s[start:i])
			start = i + 1
			continue
		}
		if s[i] == '[' {
			end, err := classEnd(s, i)
			if err != nil {
				return Pattern{}, err
			}
			i = end
		}
	}
	return p, nil
}

// classEnd returns the index of the ']' that closes the class opened at
// s[open].
func classEnd(s string, open int) (int, error) {
	i := open + 1
	if i < len(s) && (s[i] == '!' || s[i] == '^') {
		i++
	}
	if i < len(s) && s[i] == ']' { // a leading ']' is a member
		i++
	}
	for ; i < len(s); i++ {
		if s[i] == ']' {
			if i == open+1 {
				break
			}
			return i, nil
		}
		if s[i] == '|' {
			break
		}
	}
	return 0, &patternError{at: open, msg: "unclosed '['"}
}

// Match reports whether v matches one of the alternatives.
func (p Pattern) Match(v string) bool {
	if len(p.alts) == 0 {
		return v == ""
	}
	for _, a := range p.alts {
		if globMatch(a, v) {
			return true
		}
	}
	return false
}

// globMatch matches v against one alternative, backtracking only on the
// last '*' (linear in practice).
func globMatch(pat, v string) bool {
	px, vx := 0, 0
	starP, starV := -1, 0
	for vx < len(v) {
		if px < len(pat) {
			switch c := pat[px]; c {
			case '*':
				starP, starV = px, vx
				px++
				continue
			case '?':
				px++
				vx++
				continue
			case '[':
				end, _ := classEnd(pat, px)
				if classMatch(pat[px+1:end], v[vx]) {
					px = end + 1
					vx++
					continue
				}
			default:
				if c == v[vx] {
					px++
					vx++
					continue
				}
			}
		}
		if starP < 0 {
			return false
		}
		starV++
		px, vx = starP+1, starV
	}
	for px < len(pat) && pat[px] == '*' {
		px++
	}
	return px == len(pat)
}

func classMatch(class string, c byte) bool {
	neg := false
	if len(class) > 0 && (class[0] == '!' || class[0] == '^') {
		neg = true
		class = class[1:]
	}
	in := false
	for i := 0; i < len(class); i++ {
		if i+2 < len(class) && class[i+1] == '-' {
			if class[i] <= c && c <= class[i+2] {
				in = true
			}
			i += 2
			continue
		}
		if class[i] == c {
			in = true
		}
	}
	return in != neg
}
