package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/test/framework/dowse"
	"github.com/dowse-dev/dowse/test/framework/kube"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// TestStartBeforeTheAPI: the agent and the controller started before
// Dowse's CRDs are served (as a new user does, a moment after `kubectl
// apply -f deploy/crds`), or while the API server is away, wait and say
// what they wait for, instead of exiting; once it is there they start.
func TestStartBeforeTheAPI(t *testing.T) {
	cp, err := kube.StartBare()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cp.Stop() })
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := cp.Kubeconfig(kubeconfig); err != nil {
		t.Fatal(err)
	}
	port := func() int {
		p, err := procs.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	ctlHealth, agentHealth := port(), port()
	ctl := dowse.Controller{Kubeconfig: kubeconfig, Health: ctlHealth}.StartLogged(t, dir, "controller")
	agent := dowse.Agent{Kubeconfig: kubeconfig, Node: "node-a", StateDir: filepath.Join(dir, "node-a"), Health: agentHealth}.StartLogged(t, dir, "agent-a")

	logHas := func(name string, words ...string) error {
		b, err := os.ReadFile(filepath.Join(dir, name+".log"))
		if err != nil {
			return err
		}
		for _, w := range words {
			if !bytes.Contains(b, []byte(w)) {
				return fmt.Errorf("%s.log lacks %q:\n%s", name, w, b)
			}
		}
		return nil
	}
	alive := func(ps ...*procs.Proc) func() error {
		return func() error {
			for _, p := range ps {
				if !p.Alive() {
					return errors.New("a process exited while it waited for the API server")
				}
			}
			return nil
		}
	}
	ready := func(port int) func() error {
		return func() error {
			code, err := httpGet(fmt.Sprintf("http://127.0.0.1:%d/readyz", port))
			if err == nil && code != http.StatusOK {
				err = fmt.Errorf("readyz answers %d", code)
			}
			return err
		}
	}
	for _, name := range []string{"controller", "agent-a"} {
		testwait.For(t, 30*time.Second, func() error {
			return logHas(name, "waiting for the API server", "does not serve dowse.dev/v1alpha1", "kubectl apply -f deploy/crds")
		})
	}
	testwait.Holds(t, 3*time.Second, alive(ctl, agent))

	if err := kube.InstallCRDs(cp.Config); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, time.Minute, ready(ctlHealth))
	testwait.For(t, time.Minute, ready(agentHealth))
	for _, name := range []string{"controller", "agent-a"} {
		if err := logHas(name, "the API server serves what this process needs"); err != nil {
			t.Error(err)
		}
	}

	// The API server away when an agent starts: it waits for it too.
	if err := cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	bHealth := port()
	agentB := dowse.Agent{Kubeconfig: kubeconfig, Node: "node-b", StateDir: filepath.Join(dir, "node-b"), Health: bHealth}.StartLogged(t, dir, "agent-b")
	testwait.For(t, 30*time.Second, func() error {
		return logHas("agent-b", "waiting for the API server", "cannot ask it what it serves")
	})
	testwait.Holds(t, 2*time.Second, alive(agentB))
	if err := cp.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	testwait.For(t, time.Minute, ready(bHealth))
}
