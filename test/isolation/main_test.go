// Package isolation proves that an agent's credentials reach only its own
// node's business: on the real API server, with the RBAC and admission
// policy of deploy/agent/agent.yaml and the real pod-bound service account
// tokens of agents on two nodes.
package isolation

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dowse-dev/dowse/shared/scheme"
	"github.com/dowse-dev/dowse/test/kube"
)

var (
	cp        *kube.ControlPlane
	admin     client.Client
	clientset *kubernetes.Clientset
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	ctrllog.SetLogger(logr.Discard())
	var err error
	if cp, err = kube.Start(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := cp.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping control plane:", err)
		}
	}()
	sch, err := scheme.New()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if admin, err = client.New(cp.Config, client.Options{Scheme: sch}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	clientset = kubernetes.NewForConfigOrDie(cp.Config)
	if err := kube.InstallAgentAccess(context.Background(), cp.Config); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}
