package mdns

import (
	"testing"
	"time"

	"github.com/miekg/dns"
)

// FuzzPacket feeds what could come from the wire through the handler's
// whole path: unpacking, the cache (with its bounds), expiry, the services
// and their devices. Nothing may panic, and the bounds must hold.
func FuzzPacket(f *testing.F) {
	d, err := ParseDetails(`{"serviceTypes": ["_http._tcp", "_ipp._tcp"], "maxServices": 4, "txt": {"ty": "."}}`)
	if err != nil {
		f.Fatal(err)
	}
	for _, rrs := range [][]string{
		printer("a", 120, `"ty=x" "rp"`),
		printer(`we\ird\.name`, 0, `"=" "==" "ty"`),
		{`_http._tcp.local. 10 IN PTR x._http._tcp.local.`, `x._http._tcp.local. 10 IN SRV 0 0 80 h.local.`, `h.local. 10 IN AAAA ::1`},
	} {
		b, err := response(f, rrs...).Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte{0, 0, 0x84, 0, 0, 0, 0, 1, 0, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > MaxPacket {
			return
		}
		c := newCache(d)
		now := time.Unix(1000, 0)
		for i := range 3 { // the same message again, and later
			m := new(dns.Msg)
			if err := m.Unpack(b); err != nil {
				return
			}
			c.add(m, now.Add(time.Duration(i)*time.Second))
			c.missing(now)
			c.expire(now.Add(time.Duration(i) * time.Second))
			devs, _ := list(c, nil)
			if len(devs) > d.MaxServices {
				t.Fatalf("%d devices, more than maxServices", len(devs))
			}
			for _, dev := range devs {
				if dev.Id == "" {
					t.Fatal("a device without an id")
				}
			}
		}
		for k, es := range c.rrs {
			if len(es) > maxPerName {
				t.Fatalf("%d records of %v", len(es), k)
			}
		}
	})
}
