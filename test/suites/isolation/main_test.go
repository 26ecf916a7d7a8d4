// Package isolation proves that an agent's credentials reach only its own
// node's business: on the real API server, with the RBAC and admission
// policy of deploy/agent/agent.yaml and the real pod-bound service account
// tokens of agents on two nodes.
package isolation

import (
	"os"
	"testing"

	"github.com/dowse-dev/dowse/test/framework/kube"
)

var suite = &kube.Suite{NamespacePrefix: "iso-", AgentAccess: true}

func TestMain(m *testing.M) { os.Exit(suite.Run(m)) }
