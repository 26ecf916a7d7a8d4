package twinvalue

import (
	"go/parser"
	"go/token"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestParse is the one table of every type's edge cases: what the
// controller, dowsectl, the agent and the mapper SDK all accept and refuse.
func TestParse(t *testing.T) {
	for _, c := range []struct {
		typ  Type
		in   string
		want any    // the value; nil when refused
		err  string // part of the refusal
	}{
		// INT: 64 bits, decimal, whitespace ignored.
		{Int, "42", int64(42), ""},
		{Int, " -7\n", int64(-7), ""},
		{Int, "+007", int64(7), ""},
		{Int, "9223372036854775807", int64(math.MaxInt64), ""},
		{Int, "-9223372036854775808", int64(math.MinInt64), ""},
		{Int, "9223372036854775808", nil, "does not fit an INT"},
		{Int, "-9223372036854775809", nil, "does not fit an INT"},
		{Int, "4.2", nil, `"4.2" is not an INT`},
		{Int, "1.5", nil, "is not an INT"},
		{Int, "1e3", nil, "is not an INT"},
		{Int, "0x10", nil, "is not an INT"},
		{Int, "1_000", nil, "is not an INT"},
		{Int, "", nil, `"" is not an INT`},
		{Int, "   ", nil, "is not an INT"},
		{Int, "warm", nil, `"warm" is not an INT`},
		// FLOAT: within float32's range, kept as the text's float64.
		{Float, "1.5", 1.5, ""},
		{Float, "0.1", 0.1, ""},
		{Float, " 12.375 ", 12.375, ""},
		{Float, "3.4028235e38", 3.4028235e38, ""}, // float32's largest, as Format writes it
		{Float, "-3.4028235e38", -3.4028235e38, ""},
		{Float, "1e39", nil, "does not fit a FLOAT (32 bits)"},
		{Float, "-1e39", nil, "does not fit a FLOAT"},
		{Float, "1e-50", 1e-50, ""}, // underflows to float32's 0: not a range error
		{Float, "NaN", nil, "is not a finite FLOAT"},
		{Float, "nan", nil, "is not a finite FLOAT"},
		{Float, "Inf", nil, "is not a finite FLOAT"},
		{Float, "-Infinity", nil, "is not a finite FLOAT"},
		{Float, "", nil, `"" is not a FLOAT`},
		{Float, "1,5", nil, "is not a FLOAT"},
		// DOUBLE: 64 bits, finite.
		{Double, "1e39", 1e39, ""},
		{Double, "-0", math.Copysign(0, -1), ""},
		{Double, "1.7976931348623157e308", math.MaxFloat64, ""},
		{Double, "1e309", nil, "does not fit a DOUBLE (64 bits)"},
		{Double, "-1e309", nil, "does not fit a DOUBLE"},
		{Double, "5e-324", 5e-324, ""},
		{Double, "0x1p-2", 0.25, ""}, // strconv's grammar: Go's hexadecimal floats too
		{Double, "NaN", nil, "is not a finite DOUBLE"},
		{Double, "+Inf", nil, "is not a finite DOUBLE"},
		{Double, "-inf", nil, "is not a finite DOUBLE"},
		{Double, "\t2.5\n", 2.5, ""},
		{Double, "", nil, "is not a DOUBLE"},
		{Double, "abc", nil, `"abc" is not a DOUBLE`},
		// BOOLEAN: strconv.ParseBool's words.
		{Boolean, "true", true, ""},
		{Boolean, "FALSE", false, ""},
		{Boolean, "1", true, ""},
		{Boolean, " 0 ", false, ""},
		{Boolean, "t", true, ""},
		{Boolean, "yes", nil, "is not a BOOLEAN (true or false)"},
		{Boolean, "on", nil, "is not a BOOLEAN"},
		{Boolean, "", nil, "is not a BOOLEAN"},
		// BYTES: standard base64 with padding.
		{Bytes, "AAEC", []byte{0, 1, 2}, ""},
		{Bytes, "AQI=", []byte{1, 2}, ""},
		{Bytes, " AQI=\n", []byte{1, 2}, ""},
		{Bytes, "AQ\nI=", []byte{1, 2}, ""}, // line breaks inside, as base64 allows
		{Bytes, "", []byte{}, ""},
		{Bytes, "AQI", nil, "is not BYTES (standard base64)"}, // unpadded
		{Bytes, "_-8=", nil, "is not BYTES"},                  // URL alphabet
		{Bytes, "not base64!", nil, "is not BYTES"},
		{Bytes, "!!", nil, "is not BYTES"},
		// STRING: as is.
		{String, "", "", ""},
		{String, " on ", " on ", ""},
		{String, "NaN", "NaN", ""},
		{String, "héllo", "héllo", ""},
		{String, "\xff", nil, "is not UTF-8 text"},
		// Types as KubeEdge's models spell them; unknown ones.
		{"", "x", "x", ""},
		{"int", "3", int64(3), ""},
		{"integer", "3", int64(3), ""},
		{"bool", "true", true, ""},
		{"float", "1e39", nil, "does not fit a FLOAT"},
		{"STREAM", "x", nil, `unknown property type "STREAM"`},
	} {
		got, err := Parse(c.typ, c.in)
		if c.want == nil {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("Parse(%s, %q) = %v, %v; want an error with %q", c.typ, c.in, got, err, c.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) || (c.want == math.Copysign(0, -1) && !math.Signbit(got.(float64))) {
			t.Errorf("Parse(%s, %q) = %#v, %v; want %#v", c.typ, c.in, got, err, c.want)
		}
	}
}

// TestFormat: a reading (Parse's kinds and a driver's) as twin text, and
// the readings no text of the type can hold.
func TestFormat(t *testing.T) {
	for _, c := range []struct {
		typ  Type
		v    any
		want string // "" with err set: refused
		err  string
	}{
		{Int, int64(-7), "-7", ""},
		{Int, 2.6, "3", ""},
		{Int, -2.5, "-3", ""},
		{Int, uint64(math.MaxInt64), "9223372036854775807", ""},
		{Int, uint64(math.MaxInt64) + 1, "", "does not fit an INT"},
		{Int, 9.3e18, "", "does not fit an INT"},
		{Int, -9.3e18, "", "does not fit an INT"},
		{Int, float32(3), "3", ""},
		{Int, 5, "5", ""},
		{Int, true, "1", ""},
		{Int, " 12 ", "12", ""},
		{Int, "abc", "", `"abc" is not an INT`},
		{Int, math.NaN(), "", "is not an INT"},
		{Int, math.Inf(1), "", "is not an INT"},
		{Int, []byte{1}, "", "is not an INT"},
		{Float, 12.375, "12.375", ""},
		{Float, float64(float32(0.1)), "0.1", ""}, // a float32 register's 0.1
		{Float, 0.1, "0.1", ""},
		{Float, math.MaxFloat32, "3.4028235e+38", ""},
		{Float, 1e39, "", "does not fit a FLOAT"},
		{Float, "1e39", "", "does not fit a FLOAT"},
		{Float, math.NaN(), "", "not a finite number"},
		{Float, "NaN", "", "is not a finite FLOAT"},
		{Float, " 2.50 ", "2.5", ""},
		{Double, 0.1, "0.1", ""},
		{Double, int64(1) << 53, "9.007199254740992e+15", ""},
		{Double, math.Inf(-1), "", "not a finite number"},
		{Double, math.NaN(), "", "not a finite number"},
		{Double, "x", "", `"x" is not a DOUBLE`},
		{Double, struct{}{}, "", "is not a DOUBLE"},
		{Boolean, false, "false", ""},
		{Boolean, int64(1), "true", ""},
		{Boolean, 0.0, "false", ""},
		{Boolean, "T", "true", ""},
		{Boolean, "yes", "", "is not a BOOLEAN"},
		{Boolean, math.NaN(), "", "is not a BOOLEAN"},
		{Bytes, []byte{1, 2}, "AQI=", ""},
		{Bytes, []byte{}, "", ""},
		{Bytes, "ab", "YWI=", ""},
		{Bytes, int64(1), "", "is not BYTES"},
		{String, "x", "x", ""},
		{String, []byte("ABCD"), "ABCD", ""},
		{String, true, "true", ""},
		{String, uint64(math.MaxUint64), "18446744073709551615", ""},
		{String, 2.5, "2.5", ""},
		{String, 7, "7", ""},
		{String, []byte{0xff, 0xfe}, "", "is not UTF-8 text"},
		{"STREAM", "x", "", "unknown property type"},
	} {
		got, err := Format(c.typ, c.v)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("Format(%s, %#v) = %q, %v; want an error with %q", c.typ, c.v, got, err, c.err)
			}
			continue
		}
		if err != nil || got != c.want {
			t.Errorf("Format(%s, %#v) = %q, %v; want %q", c.typ, c.v, got, err, c.want)
			continue
		}
		// What Format writes, Parse takes, and writes back the same.
		v, err := Parse(c.typ, got)
		if err != nil {
			t.Errorf("Parse(%s, Format(%#v) = %q): %v", c.typ, c.v, got, err)
			continue
		}
		if again, err := Format(c.typ, v); err != nil || again != got {
			t.Errorf("Format(%s, Parse(%q)) = %q, %v; not the same text", c.typ, got, again, err)
		}
	}
}

func TestParseType(t *testing.T) {
	for in, want := range map[string]Type{
		"INT": Int, "int": Int, "Integer": Int, " float ": Float, //nolint:gocritic // the spaces are the test
		"double": Double,
		"string": String, "": String, "boolean": Boolean, "BOOL": Boolean, "bytes": Bytes,
	} {
		if got, err := ParseType(in); err != nil || got != want {
			t.Errorf("ParseType(%q) = %q, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"COMPLEX", "int64", "str"} {
		if got, err := ParseType(in); err == nil {
			t.Errorf("ParseType(%q) = %q, want an error", in, got)
		}
	}
	for typ, numeric := range map[Type]bool{Int: true, Float: true, Double: true, String: false, Boolean: false, Bytes: false} {
		if typ.Numeric() != numeric {
			t.Errorf("%s.Numeric() = %v", typ, !numeric)
		}
	}
}

func TestParseDesired(t *testing.T) {
	rw := func(typ Type, lo, hi string) Property {
		return Property{Name: "p", Type: typ, AccessMode: ReadWrite, Minimum: lo, Maximum: hi}
	}
	for _, c := range []struct {
		p    Property
		in   string
		want any
		err  string
	}{
		{Property{Name: "p", Type: Int}, "1", nil, "property p is ReadOnly: it takes no desired value"},
		{Property{Name: "p", Type: Int, AccessMode: ReadOnly}, "1", nil, "is ReadOnly"},
		{rw(Int, "", ""), "warm", nil, `property p: "warm" is not an INT`},
		{rw(Int, "0", "30"), "30", int64(30), ""},
		{rw(Int, "0", "30"), " 31 ", nil, "property p: 31 is above the maximum 30"},
		{rw(Int, "0", "30"), "-1", nil, "property p: -1 is below the minimum 0"},
		// Integers beyond float64's 53 bits compare exactly.
		{rw(Int, "", "9007199254740992"), "9007199254740993", nil, "above the maximum"},
		{rw(Int, "9007199254740993", ""), "9007199254740992", nil, "below the minimum"},
		{rw(Int, "", "2.5"), "3", nil, "above the maximum 2.5"},
		{rw(Int, "", "2.5"), "2", int64(2), ""},
		{rw(Double, "-1.5", "1.5"), "1.5", 1.5, ""},
		{rw(Double, "-1.5", "1.5"), "1.50001", nil, "above the maximum 1.5"},
		{rw(Double, "-1e3", ""), "-1000.1", nil, "below the minimum -1e3"},
		// What v1alpha1 used to let through and the mapper refused.
		{rw(Double, "0", "10"), "NaN", nil, "is not a finite DOUBLE"},
		{rw(Double, "", ""), "Inf", nil, "is not a finite DOUBLE"},
		{rw(Float, "", ""), "1e39", nil, "does not fit a FLOAT"},
		// Bounds that are not numbers.
		{rw(Int, "low", ""), "1", nil, `the model's minimum "low" is not a number`},
		{rw(Double, "", "NaN"), "1", nil, `the model's maximum "NaN" is not a number`},
		// Bounds do not apply to other types.
		{rw(String, "1", "2"), "zzz", "zzz", ""},
		{rw(Boolean, "x", ""), "true", true, ""},
		{rw(Bytes, "", ""), "AQI=", []byte{1, 2}, ""},
	} {
		got, err := c.p.ParseDesired(c.in)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%+v.ParseDesired(%q) = %v, %v; want an error with %q", c.p, c.in, got, err, c.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%+v.ParseDesired(%q) = %#v, %v; want %#v", c.p, c.in, got, err, c.want)
		}
	}

	lo, hi, err := rw(Int, "-3", "").Range()
	if err != nil || lo == nil || *lo != -3 || hi != nil {
		t.Errorf("Range of [-3, ) = %v, %v, %v", lo, hi, err)
	}
	if lo, hi, err := rw(String, "a", "b").Range(); lo != nil || hi != nil || err != nil {
		t.Errorf("Range of a STRING = %v, %v, %v; want none", lo, hi, err)
	}
	if _, _, err := rw(Double, "", "x").Range(); err == nil {
		t.Errorf("Range with a maximum of x: no error")
	}
}

func TestMetadataAndStates(t *testing.T) {
	at := time.UnixMilli(1_700_000_000_123)
	md := map[string]string{MetaTimestamp: Timestamp(at)}
	if md[MetaTimestamp] != "1700000000123" {
		t.Errorf("Timestamp = %s", md[MetaTimestamp])
	}
	if got, ok := TimestampOf(md); !ok || !got.Equal(at) {
		t.Errorf("TimestampOf = %v, %v", got, ok)
	}
	for _, bad := range []string{"", "0", "-5", "12.5", "soon"} {
		if got, ok := TimestampOf(map[string]string{MetaTimestamp: bad}); ok {
			t.Errorf("TimestampOf(%q) = %v", bad, got)
		}
	}
	for _, s := range States() {
		if got, err := ParseState(" " + strings.ToUpper(s)); err != nil || got != s {
			t.Errorf("ParseState(%s) = %q, %v", s, got, err)
		}
	}
	if _, err := ParseState("exploded"); err == nil || !strings.Contains(err.Error(), `"exploded" is not one of ok, online, offline`) {
		t.Errorf("ParseState(exploded): %v", err)
	}
	if !Online(StateOK) || !Online(StateOnline) || Online(StateOffline) || Online(StateDisconnected) {
		t.Errorf("Online is wrong")
	}
}

// TestStandardLibraryOnly: the mapper SDK and the CRD types import this
// package, so it links nothing but the standard library.
func TestStandardLibraryOnly(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
		if err != nil {
			t.Fatal(err)
		}
		for _, imp := range file.Imports {
			path := strings.Trim(imp.Path.Value, `"`)
			if first, _, _ := strings.Cut(path, "/"); strings.Contains(first, ".") {
				t.Errorf("%s imports %s: only the standard library belongs here", f, path)
			}
		}
	}
}
