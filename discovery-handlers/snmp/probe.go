package snmp

import (
	"context"
	"errors"
	"fmt"

	"github.com/gosnmp/gosnmp"

	"github.com/dowse-dev/dowse/internal/snmpclient"
)

// The system group objects a probe asks for (SNMPv2-MIB).
const (
	oidSysDescr    = ".1.3.6.1.2.1.1.1.0"
	oidSysObjectID = ".1.3.6.1.2.1.1.2.0"
	oidSysName     = ".1.3.6.1.2.1.1.5.0"
)

var systemOIDs = []string{oidSysDescr, oidSysObjectID, oidSysName}

// agentInfo is what an agent told of itself.
type agentInfo struct {
	descr, objectID, name string
}

// outcome is what one probe of one target learnt.
type outcome int

const (
	// noAnswer: silence or a closed port. A known agent counts a failure.
	noAnswer outcome = iota
	// notDevice: something answered, but it refused the credentials,
	// answered garbage or failed the match. A known agent is dropped at
	// once.
	notDevice
	// device: an agent answered and passed the match.
	device
)

// result is the probe of one target.
type result struct {
	target  target
	outcome outcome
	info    agentInfo
	reason  string // a Skip* reason when it is no device
	why     string // what happened, when it is no device
}

// Reasons a target is skipped, reported to the agent (handler.SetSkipped).
const (
	// SkipNoReply: nothing answered in time, or the port is closed. A
	// v1/v2c agent drops a request with a wrong community silently, so a
	// wrong community shows here.
	SkipNoReply = "NoReply"
	// SkipAuthRefused: a v3 agent refused the user or its passphrases.
	SkipAuthRefused = "AuthRefused"
	// SkipGarbage: what answered is not a usable SNMP response.
	SkipGarbage = "Garbage"
	// SkipNoMatch: an agent answered, and failed the match.
	SkipNoMatch = "NoMatch"
)

// probe asks one target for its system group. A panic in gosnmp's decoding
// of the answer is that target's garbage, not the handler's end.
func probe(ctx context.Context, d *Details, sec *snmpclient.Security, t target) result {
	r := result{target: t}
	g := snmpclient.New(ctx, t.Host, t.Port, sec, d.timeout)
	var pkt *gosnmp.SnmpPacket
	err := snmpclient.Do(func() error {
		if err := g.Connect(); err != nil {
			return fmt.Errorf("%w: %w", snmpclient.ErrNoAnswer, err)
		}
		defer g.Close()
		var err error
		pkt, err = g.Get(systemOIDs)
		return err
	})
	if err == nil {
		r.info, err = readAnswer(pkt)
	}
	err = snmpclient.Classify(err)
	switch {
	case err == nil:
	case errors.Is(err, snmpclient.ErrNoAnswer):
		r.outcome, r.reason, r.why = noAnswer, SkipNoReply, err.Error()
		if sec.Version != snmpclient.V3 {
			r.why += " (v1 and v2c agents drop requests with a wrong community without a word)"
		}
		return r
	case errors.Is(err, snmpclient.ErrAuth):
		r.outcome, r.reason, r.why = notDevice, SkipAuthRefused, err.Error()
		return r
	case errors.Is(err, snmpclient.ErrGarbage):
		r.outcome, r.reason, r.why = notDevice, SkipGarbage, err.Error()
		return r
	default: // the stream's end
		r.outcome, r.reason, r.why = noAnswer, SkipNoReply, err.Error()
		return r
	}
	if ok, why := d.matches(r.info); !ok {
		r.outcome, r.reason, r.why = notDevice, SkipNoMatch, why
		return r
	}
	r.outcome = device
	return r
}

// readAnswer reads the system group from an agent's response, refusing a
// response that is not one to the probe: an error status, missing or
// mistyped objects. Values are bounded (snmpclient.Text).
func readAnswer(pkt *gosnmp.SnmpPacket) (agentInfo, error) {
	var a agentInfo
	if pkt == nil {
		return a, fmt.Errorf("%w: an empty response", snmpclient.ErrGarbage)
	}
	if pkt.Error != gosnmp.NoError {
		return a, fmt.Errorf("%w: the agent answered the system group's GET with error %s (index %d)", snmpclient.ErrGarbage, pkt.Error, pkt.ErrorIndex)
	}
	if pkt.PDUType != gosnmp.GetResponse {
		return a, fmt.Errorf("%w: a %s PDU instead of a response", snmpclient.ErrGarbage, pkt.PDUType)
	}
	var gotDescr, gotID bool
	for _, v := range pkt.Variables {
		switch v.Name {
		case oidSysDescr:
			if v.Type != gosnmp.OctetString {
				return a, fmt.Errorf("%w: sysDescr is a %s, not an OCTET STRING", snmpclient.ErrGarbage, v.Type)
			}
			a.descr, gotDescr = snmpclient.Text(v.Value), true
		case oidSysObjectID:
			if v.Type != gosnmp.ObjectIdentifier {
				return a, fmt.Errorf("%w: sysObjectID is a %s, not an OBJECT IDENTIFIER", snmpclient.ErrGarbage, v.Type)
			}
			s, _ := v.Value.(string)
			oid, err := snmpclient.NormalizeOID(s)
			if err != nil {
				return a, fmt.Errorf("%w: sysObjectID: %w", snmpclient.ErrGarbage, err)
			}
			a.objectID, gotID = oid, true
		case oidSysName:
			// Optional in practice: an agent without it (noSuchObject)
			// is still an agent.
			if v.Type == gosnmp.OctetString {
				a.name = snmpclient.Text(v.Value)
			}
		}
	}
	if !gotDescr || !gotID {
		return a, fmt.Errorf("%w: the response lacks sysDescr or sysObjectID (%d variables)", snmpclient.ErrGarbage, len(pkt.Variables))
	}
	return a, nil
}
