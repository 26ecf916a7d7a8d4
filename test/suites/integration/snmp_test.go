//go:build linux

package integration

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/discovery-handlers/snmp"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/handler/handlertest"
	"github.com/dowse-dev/dowse/test/framework/testwait"
	"github.com/dowse-dev/dowse/test/peers/snmpd"
)

// TestSNMPAgentsBecomeInstances runs the real SNMP handler beside an agent
// and the controller against Debian's snmpd: a Configuration whose v3 user
// comes from a Secret gets the agent's Instance with its system group in
// the properties; one with a wrong passphrase in another Secret gets none,
// and its node's status says the agent refused the credentials.
func TestSNMPAgentsBecomeInstances(t *testing.T) {
	network := snmpd.NewNetwork(t)
	peer := snmpd.Start(t, snmpd.Config{Network: network, SysDescr: "APC Web/SNMP Management Card", SysObjectID: ".1.3.6.1.4.1.318.1.3.27", SysName: "ups-3",
		Users: []snmpd.User{{Name: "dowse", AuthProto: "SHA", AuthPass: "auth-pass-1", PrivProto: "AES", PrivPass: "priv-pass-1"}}})
	ns := suite.Namespace(t)
	ctx := context.Background()
	// The controller grants the agents read of the Secrets named.
	startController(t, time.Minute)
	dir := stateDir(t)
	const node = "snmp-node"
	startAgent(t, node, dir)
	cfg := snmp.Handler()
	cfg.StateDir, cfg.Logger = dir, testr.New(t).WithName("snmp")
	handlertest.Serve(t, cfg)

	for name, auth := range map[string]string{"snmp-ok": "auth-pass-1", "snmp-wrong": "auth-pass-2"} {
		sec := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Data: map[string][]byte{"user": []byte("dowse"), "auth": []byte(auth), "priv": []byte("priv-pass-1")}}
		if err := suite.Client.Create(ctx, sec); err != nil {
			t.Fatal(err)
		}
	}
	details := fmt.Sprintf(`{"targets": [%q], "version": "v3", "timeout": "300ms", "rescanInterval": "1s",
		"match": {"sysObjectIdPrefixes": [".1.3.6.1.4.1.318"]}}`, netip.PrefixFrom(network.Prefix.Addr(), 29))
	creds := func(secret string) func(*v1alpha1.Configuration) {
		ref := func(key string) *v1alpha1.DiscoveryPropertySource {
			return &v1alpha1.DiscoveryPropertySource{SecretKeyRef: &v1alpha1.ObjectKeyRef{Name: secret, Key: key}}
		}
		return func(c *v1alpha1.Configuration) {
			c.Spec.DiscoveryHandler.DiscoveryProperties = []v1alpha1.DiscoveryProperty{
				{Name: snmp.UserProperty, ValueFrom: ref("user")}, {Name: snmp.AuthPassphraseProperty, ValueFrom: ref("auth")},
				{Name: snmp.PrivPassphraseProperty, ValueFrom: ref("priv")}}
		}
	}
	createConfiguration(t, ns, "ups", "snmp", details, creds("snmp-ok"))
	wrong := createConfiguration(t, ns, "ups-wrong", "snmp", details, creds("snmp-wrong"))

	expectCount(t, ns, "ups", 1, 30*time.Second)
	var list v1alpha1.InstanceList
	if err := suite.Client.List(ctx, &list, client.InNamespace(ns)); err != nil {
		t.Fatal(err)
	}
	for _, i := range list.Items {
		if i.Spec.ConfigurationName != "ups" {
			continue
		}
		p := i.Spec.BrokerProperties
		if i.Spec.DeviceID != peer.Addr() || p[snmp.SysNameProperty] != "ups-3" || p[snmp.SysObjectIDProperty] != ".1.3.6.1.4.1.318.1.3.27" ||
			p[snmp.VersionProperty] != "v3" || p[snmp.AddressProperty] != peer.Host {
			t.Errorf("Instance %s: device %q, properties %v", i.Name, i.Spec.DeviceID, p)
		}
	}
	testwait.For(t, 30*time.Second, func() error {
		st := nodeStatus(t, ns, wrong.Name, node)
		if st == nil {
			return fmt.Errorf("no status of %s yet", node)
		}
		for _, sk := range st.Skipped {
			if sk.Reason == snmp.SkipAuthRefused && len(sk.Candidates) == 1 && sk.Candidates[0].Candidate == peer.Addr() &&
				strings.Contains(sk.Candidates[0].Message, "refused the credentials") {
				t.Logf("status.nodes[%s].skipped: %+v", node, st.Skipped)
				return nil
			}
		}
		return fmt.Errorf("skipped %+v, want AuthRefused naming %s", st.Skipped, peer.Addr())
	})
	if n := len(listInstances(t, ns, wrong.Name)); n != 0 {
		t.Errorf("a wrong passphrase gave %d Instances", n)
	}
}
