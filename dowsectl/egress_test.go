package dowsectl

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apiserver/pkg/apis/apiserver"
	"k8s.io/apiserver/pkg/server/egressselector"
)

// TestEgressConfigUDS: `dowsectl egress-config --uds` prints the
// EgressSelectorConfiguration for the controller's --egress-uds in either
// protocol, and kube-apiserver's own loader reads and validates it as the
// cluster egress over that socket; GRPC with --server (TCP) is refused,
// saying that kube-apiserver speaks GRPC only over a Unix socket, as its
// validation says of such a configuration too.
func TestEgressConfigUDS(t *testing.T) {
	uds := "/run/dowse/egress.sock"
	for _, protocol := range []string{ProtocolHTTPConnect, ProtocolGRPC} {
		var out, errOut bytes.Buffer
		if err := Run(context.Background(), []string{"egress-config", "--uds", uds, "--protocol", protocol}, &out, &errOut); err != nil {
			t.Fatalf("%s: %v (%s)", protocol, err, errOut.String())
		}
		conf, err := EgressSelectorUDS(protocol, uds)
		if err != nil || out.String() != conf {
			t.Fatalf("%s: printed\n%s\nwant what the test clusters feed kube-apiserver (%v):\n%s", protocol, out.String(), err, conf)
		}
		file := filepath.Join(t.TempDir(), "egress-selector.yaml")
		if err := os.WriteFile(file, out.Bytes(), 0o600); err != nil {
			t.Fatal(err)
		}
		c, err := egressselector.ReadEgressSelectorConfiguration(file)
		if err != nil {
			t.Fatalf("%s: kube-apiserver's loader: %v", protocol, err)
		}
		if errs := egressselector.ValidateEgressSelectorConfiguration(c); len(errs) > 0 {
			t.Fatalf("%s: kube-apiserver's validation: %v", protocol, errs.ToAggregate())
		}
		if len(c.EgressSelections) != 1 || c.EgressSelections[0].Name != "cluster" ||
			c.EgressSelections[0].Connection.ProxyProtocol != apiserver.ProtocolType(protocol) ||
			c.EgressSelections[0].Connection.Transport.UDS == nil || c.EgressSelections[0].Connection.Transport.UDS.UDSName != uds {
			t.Fatalf("%s: read as %+v", protocol, c.EgressSelections)
		}
	}

	var out, errOut bytes.Buffer
	err := Run(context.Background(), []string{"egress-config", "--protocol", ProtocolGRPC, "--server", "dowse-egress.dowse-system.svc:8132"}, &out, &errOut)
	if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "only over a Unix socket") {
		t.Fatalf("GRPC over TCP: %v, want a usage error saying GRPC is spoken only over a Unix socket", err)
	}
	// kube-apiserver agrees: GRPC over TCP does not validate.
	tcp := &apiserver.EgressSelectorConfiguration{EgressSelections: []apiserver.EgressSelection{{Name: "cluster",
		Connection: apiserver.Connection{ProxyProtocol: apiserver.ProtocolGRPC, Transport: &apiserver.Transport{TCP: &apiserver.TCPTransport{URL: "https://dowse-egress:8132"}}}}}}
	if errs := egressselector.ValidateEgressSelectorConfiguration(tcp); len(errs) == 0 {
		t.Fatal("kube-apiserver's validation takes GRPC over TCP: the refusal above is no longer right")
	}
	for _, args := range [][]string{
		{"egress-config", "--uds", "egress.sock"},
		{"egress-config", "--uds", uds, "--protocol", "SOCKS"},
		{"egress-config", "--uds", uds, "--server", "a:1"},
	} {
		if err := Run(context.Background(), args, &out, &errOut); !errors.Is(err, ErrUsage) {
			t.Fatalf("%q: %v, want a usage error", args, err)
		}
	}
}
