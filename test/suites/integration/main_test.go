// Package integration runs the agent and discovery handlers against a real
// kube-apiserver and etcd (built by hack/build-k8s.sh).
package integration

import (
	"os"
	"testing"

	"github.com/dowse-dev/dowse/test/framework/kube"
)

// Agents run as in a cluster: under their pods' tokens, with the RBAC and
// node admission policy of deploy/agent.
var suite = &kube.Suite{NamespacePrefix: "it-", AgentAccess: true}

func TestMain(m *testing.M) { os.Exit(suite.Run(m)) }
