// Package integration runs the agent and discovery handlers against a real
// kube-apiserver and etcd (built by hack/build-k8s.sh).
package integration

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/dowse-dev/dowse/agent"
	"github.com/dowse-dev/dowse/test/kube"
)

var (
	cp        *kube.ControlPlane
	k8sClient client.Client
	clientset *kubernetes.Clientset
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// The agents under test log through their own loggers; this only
	// silences controller-runtime's warning about an unset global one.
	ctrllog.SetLogger(logr.Discard())
	var err error
	cp, err = kube.Start()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer func() {
		if err := cp.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping control plane:", err)
		}
	}()
	scheme, err := agent.Scheme()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	k8sClient, err = client.New(cp.Config, client.Options{Scheme: scheme})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	clientset = kubernetes.NewForConfigOrDie(cp.Config)
	// Agents run as in a cluster: under their pods' tokens, with the RBAC
	// and node admission policy of deploy/agent.
	if err := kube.InstallAgentAccess(context.Background(), cp.Config); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}
