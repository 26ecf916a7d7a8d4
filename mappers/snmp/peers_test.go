package snmp_test

import (
	"context"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"

	"github.com/dowse-dev/dowse/mappers/mapper"
	"github.com/dowse-dev/dowse/mappers/mapper/mappertest"
	"github.com/dowse-dev/dowse/mappers/snmp"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
	"github.com/dowse-dev/dowse/test/peers/snmpd"
)

const wait = 15 * time.Second

// The system group's objects (SNMPv2-MIB).
const (
	sysDescr    = "1.3.6.1.2.1.1.1.0"
	sysUpTime   = "1.3.6.1.2.1.1.3.0"
	sysContact  = "1.3.6.1.2.1.1.4.0"
	sysName     = "1.3.6.1.2.1.1.5.0"
	sysLocation = "1.3.6.1.2.1.1.6.0"
	sysServices = "1.3.6.1.2.1.1.7.0"
)

var agentModel = mappertest.NewModel("default", "agent",
	mappertest.ModelProp("upTime", "INT", "ReadOnly", "", ""),
	mappertest.ModelProp("upSeconds", "DOUBLE", "ReadOnly", "", ""),
	mappertest.ModelProp("name", "STRING", "ReadWrite", "", ""),
	mappertest.ModelProp("contact", "STRING", "ReadWrite", "", ""),
	mappertest.ModelProp("location", "STRING", "ReadWrite", "", ""),
	mappertest.ModelProp("descr", "STRING", "ReadWrite", "", ""),
	mappertest.ModelProp("services", "INT", "ReadOnly", "", ""),
	mappertest.ModelProp("missing", "INT", "ReadOnly", "", ""),
	mappertest.ModelProp("wrongType", "INT", "ReadOnly", "", ""),
)

func prop(name, oid string, extra ...any) mappertest.Prop {
	v := map[string]any{"oid": oid}
	for i := 0; i+1 < len(extra); i += 2 {
		v[extra[i].(string)] = extra[i+1]
	}
	return mappertest.Prop{Name: name, Visitor: v, CollectCycle: 100 * time.Millisecond}
}

func agentProps() []mappertest.Prop {
	return []mappertest.Prop{
		prop("upTime", sysUpTime, "type", "timeTicks"),
		// Hundredths of a second, as seconds.
		prop("upSeconds", sysUpTime, "type", "timeTicks", "scale", 0.01),
		prop("name", sysName),
		prop("contact", sysContact),
		prop("location", sysLocation),
		prop("descr", sysDescr),
		prop("services", sysServices),
	}
}

func startMapper(t *testing.T, devices ...*dmiv1beta1.Device) *mappertest.Agent {
	t.Helper()
	dir := mappertest.ShortTempDir(t)
	agent := mappertest.Start(t, dir)
	agent.SetData([]*dmiv1beta1.DeviceModel{agentModel}, devices)
	mappertest.RunMapper(t, mapper.Config{Protocol: snmp.Protocol, StateDir: dir, NewDriver: snmp.NewDriver, Logger: testr.New(t),
		DefaultCollectCycle: 100 * time.Millisecond, ReconnectInitial: 50 * time.Millisecond,
		ReconnectMax: 200 * time.Millisecond, ReregisterInterval: time.Hour})
	return agent
}

// junkPeer answers every UDP datagram with bytes that are not SNMP.
func junkPeer(t *testing.T) string {
	t.Helper()
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 2048)
		for {
			_, from, err := c.ReadFrom(buf)
			if err != nil {
				return
			}
			_, _ = c.WriteTo([]byte("\x30\x03\x02\x01\x01HTTP/1.1 400 Bad Request\r\n"), from)
		}
	})
	t.Cleanup(func() { c.Close(); wg.Wait() })
	return c.LocalAddr().String()
}

// TestSNMPMapperPeers runs the mapper against Debian's snmpd in a network
// namespace the test makes, over v2c and v3, cross-checked with snmpget.
func TestSNMPMapperPeers(t *testing.T) {
	peer := snmpd.Start(t, snmpd.Config{Network: snmpd.NewNetwork(t), RWCommunity: "private", SysDescr: "Dowse test agent", SysObjectID: ".1.3.6.1.4.1.8072.3.2.10", SysServices: 72,
		Users: []snmpd.User{
			{Name: "rw", AuthProto: "SHA", AuthPass: "auth-pass-1", PrivProto: "AES", PrivPass: "priv-pass-1", ReadWrite: true},
		}})
	host, port := peer.Host, peer.Port
	v2 := mappertest.NewDevice(t, "default", "v2", "agent", snmp.Protocol,
		map[string]any{"address": host, "port": strconv.Itoa(port), "community": "private", "timeout": "300ms"},
		append(agentProps(), prop("missing", "1.3.6.1.2.1.1.99.0"), prop("wrongType", sysDescr, "type", "integer"))...)
	v3 := mappertest.NewDevice(t, "default", "v3", "agent", snmp.Protocol,
		map[string]any{"address": peer.Addr(), "version": "v3", "user": "rw", "authPassphrase": "auth-pass-1", "privPassphrase": "priv-pass-1",
			"authProtocol": "SHA", "privProtocol": "AES", "timeout": "300ms"}, agentProps()...)
	wrong := mappertest.NewDevice(t, "default", "wrong", "agent", snmp.Protocol,
		map[string]any{"address": peer.Addr(), "version": "v3", "user": "rw", "authPassphrase": "auth-pass-2", "privPassphrase": "priv-pass-1", "timeout": "300ms"},
		prop("upTime", sysUpTime, "type", "timeTicks"))
	junk := mappertest.NewDevice(t, "default", "junk", "agent", snmp.Protocol, map[string]any{"address": junkPeer(t), "timeout": "300ms", "retries": 0},
		prop("upTime", sysUpTime, "type", "timeTicks"))
	agent := startMapper(t, v2, v3, wrong, junk)

	t.Run("reads sysUpTime and sysName into reported twins", func(t *testing.T) {
		name := peer.Get(t, "public", sysName)
		for _, dev := range []string{"default/v2", "default/v3"} {
			agent.WaitState(t, dev, "ok", wait)
			agent.WaitReported(t, dev, "name", name, 0, wait)
			agent.WaitReported(t, dev, "descr", "Dowse test agent", 0, wait)
			agent.WaitReported(t, dev, "services", "72", 0, wait)
			// sysUpTime moves: two reports, the second later.
			tw, next := agent.WaitTwin(t, dev, "upTime", 0, wait, func(tw *dmiv1beta1.Twin) bool { return tw.GetReported().GetValue() != "" })
			first, _ := strconv.ParseInt(tw.GetReported().GetValue(), 10, 64)
			tw, _ = agent.WaitTwin(t, dev, "upTime", next, wait, func(tw *dmiv1beta1.Twin) bool { return tw.GetReported().GetValue() != "" })
			second, _ := strconv.ParseInt(tw.GetReported().GetValue(), 10, 64)
			if first <= 0 || second <= first {
				t.Errorf("%s: sysUpTime %d then %d, want it rising", dev, first, second)
			}
			tw, _ = agent.WaitTwin(t, dev, "upSeconds", 0, wait, func(tw *dmiv1beta1.Twin) bool { return tw.GetReported().GetValue() != "" })
			if s, err := strconv.ParseFloat(tw.GetReported().GetValue(), 64); err != nil || s <= 0 || s > 3600 {
				t.Errorf("%s: upSeconds %q", dev, tw.GetReported().GetValue())
			}
		}
	})

	t.Run("a desired value is SET and read back by snmpget", func(t *testing.T) {
		client := agent.Mapper(t)
		ctx := context.Background()
		from := agent.ReportCount()
		if _, err := client.UpdateDevice(ctx, &dmiv1beta1.UpdateDeviceRequest{Device: mappertest.SetDesired(v2, "contact", "ops@plant.example")}); err != nil {
			t.Fatal(err)
		}
		if _, err := client.UpdateDevice(ctx, &dmiv1beta1.UpdateDeviceRequest{Device: mappertest.SetDesired(v3, "location", "hall 3, rack 7")}); err != nil {
			t.Fatal(err)
		}
		for dev, p := range map[string]string{"default/v2": "contact", "default/v3": "location"} {
			agent.WaitTwin(t, dev, p, from, wait, func(tw *dmiv1beta1.Twin) bool {
				return tw.GetObservedDesired() != nil && tw.GetReported().GetMetadata()[twinvalue.MetaDesiredError] == ""
			})
		}
		agent.WaitReported(t, "default/v2", "contact", "ops@plant.example", from, wait)
		agent.WaitReported(t, "default/v3", "location", "hall 3, rack 7", from, wait)
		// The other device reads what this one set.
		agent.WaitReported(t, "default/v3", "contact", "ops@plant.example", from, wait)
		if got := peer.Get(t, "public", sysContact); got != "ops@plant.example" {
			t.Errorf("snmpget sysContact = %q", got)
		}
		if got := peer.Get(t, "public", sysLocation); got != "hall 3, rack 7" {
			t.Errorf("snmpget sysLocation = %q", got)
		}
		// sysDescr is fixed by snmpd's configuration: the agent refuses
		// the SET, the twin says so, and the value stays.
		from = agent.ReportCount()
		if _, err := client.UpdateDevice(ctx, &dmiv1beta1.UpdateDeviceRequest{Device: mappertest.SetDesired(mappertest.SetDesired(v2, "contact", "ops@plant.example"), "descr", "changed")}); err != nil {
			t.Fatal(err)
		}
		tw, _ := agent.WaitTwin(t, "default/v2", "descr", from, wait, func(tw *dmiv1beta1.Twin) bool {
			return tw.GetReported().GetMetadata()[twinvalue.MetaDesiredError] != ""
		})
		e := tw.GetReported().GetMetadata()[twinvalue.MetaDesiredError]
		t.Logf("a SET the agent refuses: %s", e)
		if !strings.Contains(e, "refused") {
			t.Errorf("desired error %q, want the agent's refusal", e)
		}
		if got := peer.Get(t, "public", sysDescr); got != "Dowse test agent" {
			t.Errorf("sysDescr = %q after a refused SET", got)
		}
	})

	t.Run("bad visitors are clear errors and the rest goes on", func(t *testing.T) {
		e := agent.WaitDeviceError(t, "default", "v2", "missing", wait)
		t.Logf("a missing object: %s", e)
		if !strings.Contains(e, "no such object") {
			t.Errorf("missing: %q", e)
		}
		e = agent.WaitDeviceError(t, "default", "v2", "wrongType", wait)
		t.Logf("a wrong type: %s", e)
		if !strings.Contains(e, "OctetString") {
			t.Errorf("wrongType: %q", e)
		}
		agent.WaitState(t, "default/v2", "ok", wait)
	})

	t.Run("refused credentials: Authenticated false, the others go on", func(t *testing.T) {
		c := agent.WaitCondition(t, "default/wrong", "Authenticated", false, wait)
		t.Logf("Authenticated: %s: %s", c.Reason, c.Message)
		if !strings.Contains(c.Message, "refused the credentials") {
			t.Errorf("condition message %q", c.Message)
		}
		agent.WaitState(t, "default/wrong", "offline", wait)
	})

	t.Run("a peer that answers junk is offline with a clear error, the others go on", func(t *testing.T) {
		agent.WaitState(t, "default/junk", "offline", wait)
		e := agent.WaitDeviceError(t, "default", "junk", "upTime", wait)
		t.Logf("junk: %s", e)
		if !strings.Contains(e, "not a usable SNMP response") {
			t.Errorf("junk: %q", e)
		}
		from := agent.ReportCount()
		agent.WaitTwin(t, "default/v2", "upTime", from, wait, func(tw *dmiv1beta1.Twin) bool { return tw.GetReported().GetValue() != "" })
	})

	t.Run("agent stopped and started: offline, then ok, reads resume", func(t *testing.T) {
		peer.Stop()
		agent.WaitState(t, "default/v2", "unhealthy", wait)
		peer.Restart(t)
		agent.WaitState(t, "default/v2", "ok", wait)
		from := agent.ReportCount()
		agent.WaitTwin(t, "default/v2", "upTime", from, wait, func(tw *dmiv1beta1.Twin) bool { return tw.GetReported().GetValue() != "" })
	})
}
