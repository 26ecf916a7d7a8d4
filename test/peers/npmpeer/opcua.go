package npmpeer

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/test/framework/kube"
)

// OPCUAPackages are the pinned npm packages of the node-opcua peers (a
// conformance-testing server and a local discovery server). node-opcua
// 2.183 and later need Node 22.
var OPCUAPackages = []string{
	"node-opcua@2.182.2",
	"node-opcua-address-space-for-conformance-testing@2.182.2",
	"node-opcua-server-discovery@2.182.2",
}

// OPCUAStart is how long a node-opcua peer may take to print READY: one is
// ready in about 5 s, but two making their PKI at once on a loaded 2-core
// machine took over a minute.
const OPCUAStart = 2 * time.Minute

// OPCUAScript is the launcher of the node-opcua peers; its first lines say
// what its JSON config holds.
func OPCUAScript() string {
	return filepath.Join(kube.RepoRoot(), "test", "peers", "npmpeer", "peers", "opcua-server.js")
}

// OPCUAModules returns node-opcua's node_modules (installed by
// hack/install-npm-peers.sh).
func OPCUAModules(t testing.TB) string {
	t.Helper()
	return Installed(t, "opcua", OPCUAPackages...)
}

// StartOPCUA runs a node-opcua peer with config (the launcher's keys:
// "kind", "port", "pkiDir", "applicationUri", "users"...) and stops it when
// the test ends. It does not wait for READY: a test starting several lets
// them make their keys at once.
func StartOPCUA(t testing.TB, name string, config map[string]any) *Process {
	t.Helper()
	return Start(t, name, OPCUAModules(t), OPCUAScript(), JSON(t, config))
}
