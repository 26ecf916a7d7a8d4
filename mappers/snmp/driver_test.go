package snmp

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gosnmp/gosnmp"

	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

func TestParseDevice(t *testing.T) {
	dir := t.TempDir()
	pw := filepath.Join(dir, "auth")
	if err := os.WriteFile(pw, []byte("from-a-file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := parseDevice(mapper.Params{"address": "ups-3", "port": "1161"})
	if err != nil || c.host != "ups-3" || c.port != 1161 || c.sec.Version != "v2c" || c.maxOids != DefaultMaxOids || c.retries != 1 {
		t.Errorf("defaults: %+v, %v", c, err)
	}
	if s, err := c.security(); err != nil || s.Community != "public" {
		t.Errorf("default community: %+v, %v", s, err)
	}
	c, err = parseDevice(mapper.Params{"address": "[fd00::1]:162", "version": "3", "user": "u", "authPassphraseFile": pw})
	if signsIn, files := (&Driver{cfg: c}).Credentials(); err != nil || c.host != "fd00::1" || c.port != 162 || !signsIn || len(files) != 1 {
		t.Errorf("v3 with a file: %+v, %v", c, err)
	}
	if s, err := c.security(); err != nil || s.AuthPassphrase != "from-a-file" || s.Level != "authNoPriv" {
		t.Errorf("security from a file: %+v, %v", s, err)
	}
	for cfg, want := range map[string]mapper.Params{
		"address":            {},
		"port":               {"address": "h", "port": 70000},
		"version":            {"address": "h", "version": "v4"},
		"authPassphraseFile": {"address": "h", "version": "v3", "user": "u", "authPassphraseFile": filepath.Join(dir, "absent")},
		"8 characters":       {"address": "h", "version": "v3", "user": "u", "authPassphrase": "short"},
		"maxOids":            {"address": "h", "maxOids": 61},
		"retries":            {"address": "h", "retries": 9},
	} {
		if _, err := parseDevice(want); err == nil || !strings.Contains(err.Error(), cfg) {
			t.Errorf("%v: err %v, want one naming %s", want, err, cfg)
		}
	}
}

func TestPrepareAndEncode(t *testing.T) {
	d := &Driver{}
	prep := func(typ twinvalue.Type, v mapper.Params) (*mapper.Property, error) {
		p := &mapper.Property{Name: "p", Type: typ, Visitor: v}
		return p, d.Prepare(p)
	}
	for _, c := range []struct {
		typ  twinvalue.Type
		v    mapper.Params
		want gosnmp.Asn1BER
		err  string
	}{
		{twinvalue.String, mapper.Params{"oid": "1.3.6.1.2.1.1.5.0"}, gosnmp.OctetString, ""},
		{twinvalue.Int, mapper.Params{"oid": ".1.3.6.1.2.1.1.3.0", "type": "timeTicks"}, gosnmp.TimeTicks, ""},
		{twinvalue.Boolean, mapper.Params{"oid": "1.3.6.1.4.1.1.1"}, gosnmp.Integer, ""},
		{twinvalue.Int, mapper.Params{"oid": "1.3.6.1.4.1.1.1", "type": "unsigned32"}, gosnmp.Gauge32, ""},
		{twinvalue.Int, mapper.Params{}, 0, "oid is required"},
		{twinvalue.Int, mapper.Params{"oid": "sysName.0"}, 0, "numeric"},
		{twinvalue.Int, mapper.Params{"oid": "1.3.6", "type": "bits"}, 0, "type \"bits\""},
		{twinvalue.Int, mapper.Params{"oid": "1.3.6", "type": "octetString"}, 0, "cannot hold"},
		{twinvalue.Boolean, mapper.Params{"oid": "1.3.6", "type": "gauge32"}, 0, "TruthValue"},
	} {
		p, err := prep(c.typ, c.v)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%v: err %v, want %q", c.v, err, c.err)
			}
			continue
		}
		if err != nil || p.Data.(*point).typ != c.want {
			t.Errorf("%v: %v, %v", c.v, p.Data, err)
		}
	}
	p, _ := prep(twinvalue.Boolean, mapper.Params{"oid": "1.3.6"})
	if v, err := encode(p, p.Data.(*point), false); err != nil || v != 2 {
		t.Errorf("false as a TruthValue: %v, %v", v, err)
	}
	p, _ = prep(twinvalue.Int, mapper.Params{"oid": "1.3.6"})
	if _, err := encode(p, p.Data.(*point), int64(1)<<40); err == nil {
		t.Error("2^40 as an INTEGER: no error")
	}
	p, _ = prep(twinvalue.Int, mapper.Params{"oid": "1.3.6", "type": "gauge32"})
	if v, err := encode(p, p.Data.(*point), float64(7)); err != nil || v != uint32(7) {
		t.Errorf("a gauge: %v, %v", v, err)
	}
	p, _ = prep(twinvalue.String, mapper.Params{"oid": "1.3.6"})
	if _, err := encode(p, p.Data.(*point), strings.Repeat("x", 300)); err == nil {
		t.Error("300 bytes: no error")
	}
	p, _ = prep(twinvalue.String, mapper.Params{"oid": "1.3.6", "type": "ipAddress"})
	if v, err := encode(p, p.Data.(*point), "10.0.0.7"); err != nil || v != "10.0.0.7" {
		t.Errorf("an IP address: %v, %v", v, err)
	}
}
