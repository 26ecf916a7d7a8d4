package mdns

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
)

// Bounds of what one stream keeps from the wire, beside Details.MaxServices.
const (
	// MaxPacket is the largest mDNS message taken (RFC 6762 17: 9000
	// bytes); a larger one is dropped.
	MaxPacket = 9000
	// maxRecordsPerMessage bounds the records of one message looked at.
	maxRecordsPerMessage = 256
	// maxPerName bounds the records kept of one name and type (several
	// SRV or TXT records of one instance, a host's addresses).
	maxPerName = 8
	// goodbyeGrace is how long a record with TTL 0 (a goodbye) or one
	// flushed by a cache-flush record is kept (RFC 6762 10.1, 10.2).
	goodbyeGrace = time.Second
)

// cacheFlush is the top bit of a record's class in mDNS (RFC 6762 10.2).
const cacheFlush = 1 << 15

type rrKey struct {
	name  string // lower-cased, fully qualified
	rtype uint16
}

type entry struct {
	rr       dns.RR
	data     string // the record's data, to tell two records of one key apart
	received time.Time
	expires  time.Time
}

// cache holds the records that matter to one stream's service types: the
// PTR records naming instances, their SRV and TXT records, and the
// addresses of their hosts; each until its TTL runs out.
type cache struct {
	d        *Details
	rrs      map[rrKey][]*entry
	asked    map[rrKey]time.Time // when a record was last asked for
	overflow map[string]bool     // instances ignored past MaxServices
}

func newCache(d *Details) *cache {
	return &cache{d: d, rrs: map[rrKey][]*entry{}, asked: map[rrKey]time.Time{}, overflow: map[string]bool{}}
}

// instances counts the instances named by PTR records.
func (c *cache) instances() int {
	n := 0
	for k, es := range c.rrs {
		if k.rtype == dns.TypePTR {
			n += len(es)
		}
	}
	return n
}

// add takes a response's records (answers and additional records alike, as
// RFC 6762 6 allows) and reports whether the cache changed.
func (c *cache) add(m *dns.Msg, now time.Time) bool {
	if !m.Response || m.Opcode != dns.OpcodeQuery || m.Rcode != dns.RcodeSuccess {
		return false
	}
	rrs := make([]dns.RR, 0, min(len(m.Answer)+len(m.Extra), maxRecordsPerMessage))
	for _, sec := range [][]dns.RR{m.Answer, m.Extra} {
		for _, rr := range sec {
			if len(rrs) == maxRecordsPerMessage {
				break
			}
			rrs = append(rrs, rr)
		}
	}
	changed := false
	// PTRs first: an instance must be named before its SRV and TXT count,
	// and SRVs before addresses, whatever order the message has them in.
	for _, pass := range [][]uint16{{dns.TypePTR}, {dns.TypeSRV, dns.TypeTXT}, {dns.TypeA, dns.TypeAAAA}} {
		for _, rr := range rrs {
			h := rr.Header()
			if !slices.Contains(pass, h.Rrtype) || h.Class&^cacheFlush != dns.ClassINET {
				continue
			}
			if c.relevant(rr) && c.put(rr, now) {
				changed = true
			}
		}
	}
	return changed
}

// relevant says whether rr is about one of the stream's services.
func (c *cache) relevant(rr dns.RR) bool {
	name := strings.ToLower(rr.Header().Name)
	switch rr := rr.(type) {
	case *dns.PTR:
		if !c.d.types[name] || !dns.IsSubDomain(name, strings.ToLower(rr.Ptr)) || len(dns.SplitDomainName(rr.Ptr)) != len(dns.SplitDomainName(name))+1 {
			return false
		}
		inst := strings.ToLower(rr.Ptr)
		if len(c.rrs[rrKey{name, dns.TypePTR}]) > 0 && slices.ContainsFunc(c.rrs[rrKey{name, dns.TypePTR}], func(e *entry) bool { return e.data == inst }) {
			return true
		}
		if c.instances() >= c.d.MaxServices {
			if len(c.overflow) < 64 {
				c.overflow[rr.Ptr] = true
			}
			return false
		}
		return true
	case *dns.SRV, *dns.TXT:
		return c.named(name)
	case *dns.A, *dns.AAAA:
		return c.isTarget(name)
	}
	return false
}

// named says whether an instance of ours is named by a PTR in the cache.
func (c *cache) named(instance string) bool {
	_, typ, ok := splitInstance(instance)
	if !ok || !c.d.types[typ] {
		return false
	}
	return slices.ContainsFunc(c.rrs[rrKey{typ, dns.TypePTR}], func(e *entry) bool { return e.data == instance })
}

// isTarget says whether host is the target of an SRV in the cache.
func (c *cache) isTarget(host string) bool {
	for k, es := range c.rrs {
		if k.rtype != dns.TypeSRV {
			continue
		}
		for _, e := range es {
			if srv, ok := e.rr.(*dns.SRV); ok && strings.EqualFold(srv.Target, host) {
				return true
			}
		}
	}
	return false
}

func rrData(rr dns.RR) string {
	switch rr := rr.(type) {
	case *dns.PTR:
		return strings.ToLower(rr.Ptr)
	case *dns.SRV:
		return strings.ToLower(rr.Target) + ":" + strconv.Itoa(int(rr.Port))
	case *dns.TXT:
		return strings.Join(rr.Txt, "\x00")
	case *dns.A:
		return rr.A.String()
	case *dns.AAAA:
		return rr.AAAA.String()
	}
	return ""
}

// put stores rr (or refreshes it) and reports whether what the cache says
// changed. A TTL of 0 is a goodbye: the record goes a second later. A
// record with the cache-flush bit ends the others of its name and type
// received more than a second before.
func (c *cache) put(rr dns.RR, now time.Time) bool {
	h := rr.Header()
	key := rrKey{strings.ToLower(h.Name), h.Rrtype}
	data := rrData(rr)
	es := c.rrs[key]
	changed := false
	if h.Class&cacheFlush != 0 {
		for _, e := range es {
			if e.data != data && now.Sub(e.received) > goodbyeGrace && e.expires.After(now.Add(goodbyeGrace)) {
				e.expires = now.Add(goodbyeGrace)
			}
		}
	}
	expires := now.Add(time.Duration(h.Ttl) * time.Second)
	if h.Ttl == 0 {
		expires = now.Add(goodbyeGrace)
	}
	for _, e := range es {
		if e.data == data {
			if h.Ttl == 0 && e.expires.After(expires) {
				e.expires = expires
			} else if h.Ttl > 0 {
				e.expires, e.received = expires, now
			}
			return false
		}
	}
	if h.Ttl == 0 || len(es) >= maxPerName {
		return false // a goodbye for a record we never had; or too many
	}
	rr = dns.Copy(rr)
	rr.Header().Class &^= cacheFlush
	c.rrs[key] = append(es, &entry{rr: rr, data: data, received: now, expires: expires})
	changed = true
	return changed
}

// expire drops the records whose time is up, and reports whether any went
// and when the next one will.
func (c *cache) expire(now time.Time) (changed bool, next time.Time) {
	for k, es := range c.rrs {
		kept := es[:0]
		for _, e := range es {
			if !e.expires.After(now) {
				changed = true
				continue
			}
			kept = append(kept, e)
			if next.IsZero() || e.expires.Before(next) {
				next = e.expires
			}
		}
		if len(kept) == 0 {
			delete(c.rrs, k)
		} else {
			c.rrs[k] = kept
		}
	}
	for k, t := range c.asked {
		if now.Sub(t) > time.Minute {
			delete(c.asked, k)
		}
	}
	return changed, next
}

// missing returns questions for what the known instances lack (their SRV
// and TXT records, their hosts' addresses), each asked at most once a
// second.
func (c *cache) missing(now time.Time) []dns.Question {
	var qs []dns.Question
	ask := func(name string, t uint16) {
		k := rrKey{strings.ToLower(name), t}
		if len(c.rrs[k]) > 0 || now.Sub(c.asked[k]) < time.Second || len(qs) >= 32 {
			return
		}
		c.asked[k] = now
		qs = append(qs, dns.Question{Name: name, Qtype: t, Qclass: dns.ClassINET})
	}
	for k, es := range c.rrs {
		if k.rtype != dns.TypePTR {
			continue
		}
		for _, e := range es {
			ptr, ok := e.rr.(*dns.PTR)
			if !ok {
				continue
			}
			inst := ptr.Ptr
			ask(inst, dns.TypeSRV)
			ask(inst, dns.TypeTXT)
			for _, s := range c.rrs[rrKey{strings.ToLower(inst), dns.TypeSRV}] {
				if srv, ok := s.rr.(*dns.SRV); ok {
					ask(srv.Target, dns.TypeA)
				}
			}
		}
	}
	return qs
}

// service is one instance as the cache knows it.
type service struct {
	fullName string // e.g. Office\ printer._ipp._tcp.local.
	instance string // Office printer
	typ      string // _ipp._tcp
	host     string
	port     uint16
	addrs    []netip.Addr
	txt      []string
	hasTXT   bool
}

// services returns the instances with an SRV record, in name order.
func (c *cache) services() []service {
	var out []service
	for k, es := range c.rrs {
		if k.rtype != dns.TypePTR {
			continue
		}
		for _, e := range es {
			ptr, ok := e.rr.(*dns.PTR)
			if !ok {
				continue
			}
			full := ptr.Ptr
			inst := strings.ToLower(full)
			_, typ, ok := splitInstance(inst)
			if !ok {
				continue
			}
			srvs := c.rrs[rrKey{inst, dns.TypeSRV}]
			if len(srvs) == 0 {
				continue
			}
			srv, ok := srvs[len(srvs)-1].rr.(*dns.SRV)
			if !ok {
				continue
			}
			label, _, _ := splitInstance(full)
			s := service{fullName: full, instance: unescapeLabel(strings.TrimSuffix(label, ".")), typ: strings.TrimSuffix(strings.TrimSuffix(typ, "."), ".local"),
				host: srv.Target, port: srv.Port}
			if txts := c.rrs[rrKey{inst, dns.TypeTXT}]; len(txts) > 0 {
				if txt, ok := txts[len(txts)-1].rr.(*dns.TXT); ok {
					s.txt, s.hasTXT = txt.Txt, true
				}
			}
			host := strings.ToLower(srv.Target)
			for _, t := range []uint16{dns.TypeA, dns.TypeAAAA} {
				for _, a := range c.rrs[rrKey{host, t}] {
					if ip, err := netip.ParseAddr(a.data); err == nil {
						s.addrs = append(s.addrs, ip)
					}
				}
			}
			slices.SortFunc(s.addrs, func(a, b netip.Addr) int {
				if r := cmp.Compare(addrRank(a), addrRank(b)); r != 0 {
					return r
				}
				return a.Compare(b)
			})
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b service) int { return strings.Compare(a.fullName, b.fullName) })
	return out
}

// addrRank orders a host's addresses as a client off its link can best use
// them: IPv4, then routable IPv6, then link-local IPv6 (usable only with
// an interface named).
func addrRank(a netip.Addr) int {
	switch {
	case a.Is4():
		return 0
	case !a.IsLinkLocalUnicast():
		return 1
	default:
		return 2
	}
}

// splitInstance splits "label._type._proto.local." (lower-cased or not)
// into the instance's own label (as written, escapes kept, with its dot)
// and the service type "_type._proto.local.".
func splitInstance(name string) (label, typ string, ok bool) {
	idx := dns.Split(name)
	if len(idx) < 4 {
		return "", "", false
	}
	typ = name[idx[1]:]
	return name[:idx[1]], typ, true
}

// unescapeLabel turns a label's presentation form (\032, \.) into its
// text.
func unescapeLabel(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '\\' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		if i+3 < len(s) && isDigit(s[i+1]) && isDigit(s[i+2]) && isDigit(s[i+3]) {
			if n, err := strconv.Atoi(s[i+1 : i+4]); err == nil && n < 256 {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i+1])
		i++
	}
	return b.String()
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// parseTXT reads TXT strings as key=value pairs (RFC 6763 6): keys are
// case-insensitive and the first of a key wins; a key without "=" is a
// boolean attribute (present, no value). At most MaxTXTEntries entries and
// MaxTXTBytes bytes are taken; dropped says whether some were not.
func parseTXT(txt []string) (kv map[string]string, keys []string, dropped bool) {
	kv = map[string]string{}
	total := 0
	for _, s := range txt {
		if s == "" {
			continue
		}
		k, v, _ := strings.Cut(s, "=")
		lk := strings.ToLower(k)
		if k == "" {
			continue
		}
		if _, dup := kv[lk]; dup {
			continue
		}
		if len(kv) == MaxTXTEntries || total+len(s) > MaxTXTBytes {
			dropped = true
			continue
		}
		total += len(s)
		kv[lk] = v
		keys = append(keys, k)
	}
	return kv, keys, dropped
}

// matches says whether s passes the details' instance and TXT filters, and
// why not.
func (d *Details) matches(s service) (bool, string) {
	if d.instance != nil && !d.instance.MatchString(s.instance) {
		return false, fmt.Sprintf("instance name %q does not match %q", s.instance, d.Instance)
	}
	if len(d.txt) == 0 {
		return true, ""
	}
	kv, _, _ := parseTXT(s.txt)
	for k, re := range d.txt {
		v, ok := kv[k]
		if !ok {
			return false, fmt.Sprintf("TXT has no %s", k)
		}
		if !re.MatchString(v) {
			return false, fmt.Sprintf("TXT %s=%q does not match %q", k, v, re)
		}
	}
	return true, ""
}

// txtEnv turns a TXT key into the tail of a property name.
func txtEnv(k string) string {
	b := []byte(strings.ToUpper(k))
	for i, c := range b {
		if (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			b[i] = '_'
		}
	}
	return string(b)
}

// device is a service as a Dowse device: its id is its full instance name,
// the same on every node of the link.
func (s service) device() *discoveryv1.Device {
	props := map[string]string{
		InstanceProperty: s.instance,
		ServiceProperty:  s.typ,
		DomainProperty:   "local",
		HostProperty:     strings.TrimSuffix(s.host, "."),
		PortProperty:     strconv.Itoa(int(s.port)),
	}
	if len(s.addrs) > 0 {
		props[AddressProperty] = s.addrs[0].String()
		var all []string
		for _, a := range s.addrs {
			all = append(all, a.String())
		}
		props[AddressesProperty] = strings.Join(all, ",")
	}
	kv, keys, _ := parseTXT(s.txt)
	for _, k := range keys {
		name := TXTPrefix + txtEnv(k)
		if _, taken := props[name]; !taken {
			props[name] = kv[strings.ToLower(k)]
		}
	}
	return &discoveryv1.Device{Id: strings.TrimSuffix(s.fullName, "."), Properties: props}
}
