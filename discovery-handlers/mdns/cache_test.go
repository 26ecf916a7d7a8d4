package mdns

import (
	"fmt"
	"testing"
	"time"

	"github.com/miekg/dns"
)

func rr(t testing.TB, s string) dns.RR {
	t.Helper()
	r, err := dns.NewRR(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func response(t testing.TB, rrs ...string) *dns.Msg {
	m := new(dns.Msg)
	m.Response, m.Authoritative = true, true
	for _, s := range rrs {
		m.Answer = append(m.Answer, rr(t, s))
	}
	// Through the wire format, as a peer's message comes.
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	out := new(dns.Msg)
	if err := out.Unpack(b); err != nil {
		t.Fatal(err)
	}
	return out
}

func printer(name string, ttl int, txt string) []string {
	return []string{
		fmt.Sprintf(`_ipp._tcp.local. %d IN PTR %s._ipp._tcp.local.`, ttl, name),
		fmt.Sprintf(`%s._ipp._tcp.local. %d IN SRV 0 0 631 %s-host.local.`, name, ttl, name),
		fmt.Sprintf(`%s._ipp._tcp.local. %d IN TXT %s`, name, ttl, txt),
		fmt.Sprintf(`%s-host.local. %d IN A 10.1.2.3`, name, ttl),
	}
}

func TestCache(t *testing.T) {
	d, err := ParseDetails(`{"serviceTypes": ["_ipp._tcp"], "txt": {"ty": "^Acme"}}`)
	if err != nil {
		t.Fatal(err)
	}
	c := newCache(d)
	now := time.Unix(1000, 0)
	if !c.add(response(t, printer(`Office\ one`, 120, `"txtvers=1" "ty=Acme Laser" "Color" "rp=ipp/print"`)...), now) {
		t.Fatal("no change")
	}
	c.add(response(t, printer("lab", 120, `"ty=Other"`)...), now)
	// Not ours: another type, and an A record of a host no SRV names.
	c.add(response(t, `_http._tcp.local. 120 IN PTR web._http._tcp.local.`, `stranger.local. 120 IN A 10.9.9.9`), now)
	devs, sk := list(c, nil)
	if len(devs) != 1 || devs[0].Id != `Office\ one._ipp._tcp.local` {
		t.Fatalf("devices %v", devs)
	}
	p := devs[0].Properties
	want := map[string]string{InstanceProperty: "Office one", ServiceProperty: "_ipp._tcp", HostProperty: "Office\\ one-host.local", PortProperty: "631",
		AddressProperty: "10.1.2.3", "MDNS_TXT_TY": "Acme Laser", "MDNS_TXT_COLOR": "", "MDNS_TXT_RP": "ipp/print", "MDNS_TXT_TXTVERS": "1"}
	for k, v := range want {
		if got, ok := p[k]; !ok || got != v {
			t.Errorf("%s = %q (%v), want %q", k, got, ok, v)
		}
	}
	if sk.Len() != 1 {
		t.Errorf("skipped %+v, want the lab printer", sk)
	}
	if len(c.rrs[rrKey{"stranger.local.", dns.TypeA}]) != 0 || len(c.rrs[rrKey{"_http._tcp.local.", dns.TypePTR}]) != 0 {
		t.Error("kept records of no service browsed")
	}

	// A goodbye: gone a second later.
	c.add(response(t, `_ipp._tcp.local. 0 IN PTR Office\ one._ipp._tcp.local.`), now.Add(time.Second))
	if changed, _ := c.expire(now.Add(1500 * time.Millisecond)); changed {
		t.Error("gone before the goodbye's second")
	}
	if changed, _ := c.expire(now.Add(2100 * time.Millisecond)); !changed {
		t.Error("a goodbye did not remove the record")
	}
	if devs, _ := list(c, nil); len(devs) != 0 {
		t.Errorf("devices after the goodbye: %v", devs)
	}
	// Expiry: the lab printer's records run out at 120 s.
	if _, next := c.expire(now.Add(3 * time.Second)); !next.Equal(now.Add(120 * time.Second)) {
		t.Errorf("next expiry %v", next)
	}
	c.expire(now.Add(121 * time.Second))
	if len(c.rrs) != 0 {
		t.Errorf("records left after their TTL: %v", c.rrs)
	}
}

func TestCacheBounds(t *testing.T) {
	d, err := ParseDetails(`{"serviceTypes": ["_http._tcp"], "maxServices": 3}`)
	if err != nil {
		t.Fatal(err)
	}
	c := newCache(d)
	now := time.Unix(1000, 0)
	for i := range 10 {
		c.add(response(t, fmt.Sprintf(`_http._tcp.local. 120 IN PTR s%d._http._tcp.local.`, i), fmt.Sprintf(`s%d._http._tcp.local. 120 IN SRV 0 0 80 h.local.`, i)), now)
	}
	// Unresolved, the three kept are held back.
	if devs, sk := list(c, nil); len(devs) != 0 || sk.Len() != 10 {
		t.Errorf("without an address: %d devices, %d skipped; want 0 and 10", len(devs), sk.Len())
	}
	c.add(response(t, `h.local. 120 IN A 10.0.0.200`), now)
	devs, sk := list(c, nil)
	if len(devs) != 3 || sk.Len() != 7 {
		t.Errorf("%d devices, %d skipped; want 3 and 7", len(devs), sk.Len())
	}
	// Many addresses for one host: at most maxPerName kept.
	var rrs []string
	for i := range 40 {
		rrs = append(rrs, fmt.Sprintf(`h.local. 120 IN A 10.0.0.%d`, i))
	}
	c.add(response(t, rrs...), now)
	if n := len(c.rrs[rrKey{"h.local.", dns.TypeA}]); n != maxPerName {
		t.Errorf("%d addresses kept, want %d", n, maxPerName)
	}
	// Too many TXT entries.
	var txt []string
	for i := range 100 {
		txt = append(txt, fmt.Sprintf("k%d=v", i))
	}
	kv, _, dropped := parseTXT(txt)
	if len(kv) != MaxTXTEntries || !dropped {
		t.Errorf("%d TXT entries, dropped %v", len(kv), dropped)
	}
}

func TestCacheFlush(t *testing.T) {
	d, _ := ParseDetails(`{"serviceTypes": ["_http._tcp"]}`)
	c := newCache(d)
	now := time.Unix(1000, 0)
	c.add(response(t, `_http._tcp.local. 120 IN PTR s._http._tcp.local.`, `s._http._tcp.local. 120 IN SRV 0 0 80 h.local.`, `h.local. 120 IN A 10.0.0.1`), now)
	m := response(t, `h.local. 120 IN A 10.0.0.2`)
	m.Answer[0].Header().Class |= cacheFlush
	c.add(m, now.Add(5*time.Second))
	c.expire(now.Add(6100 * time.Millisecond))
	devs, _ := list(c, nil)
	if len(devs) != 1 || devs[0].Properties[AddressesProperty] != "10.0.0.2" {
		t.Errorf("after a cache flush: %v", devs)
	}
}

// TestAddressOrder: a host's addresses come IPv4 first, then routable
// IPv6, then link-local IPv6, whatever order they were announced in.
func TestAddressOrder(t *testing.T) {
	d, _ := ParseDetails(`{"serviceTypes": ["_http._tcp"]}`)
	c := newCache(d)
	c.add(response(t, `_http._tcp.local. 120 IN PTR s._http._tcp.local.`, `s._http._tcp.local. 120 IN SRV 0 0 80 h.local.`,
		`h.local. 120 IN AAAA fe80::1`, `h.local. 120 IN AAAA fd00::7`, `h.local. 120 IN A 10.0.0.1`), time.Unix(1000, 0))
	devs, _ := list(c, nil)
	if len(devs) != 1 || devs[0].Properties[AddressesProperty] != "10.0.0.1,fd00::7,fe80::1" || devs[0].Properties[AddressProperty] != "10.0.0.1" {
		t.Errorf("devices %v, want addresses 10.0.0.1,fd00::7,fe80::1", devs)
	}
}

func TestParseDetails(t *testing.T) {
	for details, field := range map[string]string{
		`{}`:                         "serviceTypes",
		`{"serviceTypes": ["http"]}`: "serviceTypes[0]",
		`{"serviceTypes": ["_http._tcp"], "domain": "example.com"}`: "domain",
		`{"serviceTypes": ["_http._tcp"], "txt": {"a": "("}}`:       "txt.a",
		`{"serviceTypes": ["_http._tcp"], "maxServices": 5000}`:     "maxServices",
		`{"serviceTypes": ["_http._tcp"], "queryInterval": "10ms"}`: "queryInterval",
		`{"serviceTypes": ["_http._tcp"], "ipFamilies": ["ipx"]}`:   "ipFamilies[0]",
	} {
		if _, err := ParseDetails(details); err == nil || !contains(err.Error(), field) {
			t.Errorf("%s: %v, want an error naming %s", details, err, field)
		}
	}
	d, err := ParseDetails(`{"serviceTypes": ["_http._tcp.local.", "_esphomelib._tcp"]}`)
	if err != nil || !d.types["_http._tcp.local."] || !d.types["_esphomelib._tcp.local."] || d.interval != DefaultQueryInterval {
		t.Errorf("%+v %v", d, err)
	}
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}
