package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/dowsectl"
	"github.com/dowse-dev/dowse/test/framework/procs"
)

// processNode is the node the process demo's agent says it runs on.
const processNode = "demo-node"

// processes are the binaries the process demo runs, stopped in reverse
// order.
type processes struct {
	logs io.Writer
	ps   []*procs.Proc
}

func (p *processes) start(name string, args ...string) error {
	pr, err := procs.Start(name, p.logs, args...)
	if err != nil {
		return err
	}
	p.ps = append(p.ps, pr)
	return nil
}

func (p *processes) stop() {
	for i := len(p.ps) - 1; i >= 0; i-- {
		say("stopping %s (pid %d)", p.ps[i].Name, p.ps[i].Pid())
		p.ps[i].Stop()
	}
}

func (p *processes) String() string {
	var out []string
	for _, pr := range p.ps {
		out = append(out, fmt.Sprintf("%s (pid %d)", pr.Name, pr.Pid()))
	}
	return strings.Join(out, ", ")
}

// startProcessLink starts dowse-controller with the cloud/edge link on
// loopback and mints the process agent's bootstrap token once the
// controller has made the link CA; it returns the agent's link flags.
func startProcessLink(ctx context.Context, c client.Client, ps *processes, kubeconfig string) (*processLink, error) {
	var ports [3]int
	for i := range ports {
		p, err := procs.FreePort()
		if err != nil {
			return nil, err
		}
		ports[i] = p
	}
	for _, obj := range []client.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "dowse-system"}},
		&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: processNode}}} {
		if err := c.Create(ctx, obj); client.IgnoreAlreadyExists(err) != nil {
			return nil, err
		}
	}
	if err := ps.start("dowse-controller", "--kubeconfig", kubeconfig, "--leader-elect=false",
		"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", ports[0]), "--health-probe-bind-address", "0",
		"--link-hosts", "127.0.0.1", "--link-websocket-address", fmt.Sprintf("127.0.0.1:%d", ports[1]), "--link-quic-address", "",
		"--link-auth-bind-address", fmt.Sprintf("127.0.0.1:%d", ports[2])); err != nil {
		return nil, err
	}
	var tok dowsectl.Result
	args := []string{"token", "create", "--kubeconfig", kubeconfig, "--node", processNode, "--ttl", "1h", "--output", "json"}
	if err := poll(ctx, time.Minute, 300*time.Millisecond, "the link CA and a bootstrap token", func() (bool, error) {
		var out, errs bytes.Buffer
		if err := dowsectl.Run(ctx, args, &out, &errs); err != nil {
			return false, fmt.Errorf("%w: %s", err, errs.String())
		}
		return true, json.Unmarshal(out.Bytes(), &tok)
	}); err != nil {
		return nil, err
	}
	say("$ dowsectl %s   (the agent joins the link with it)", strings.Join(args, " "))
	return &processLink{demoLink: demoLink{metricsPort: ports[0], how: "the bootstrap token"}, agentArgs: []string{
		"--link-server", fmt.Sprintf("127.0.0.1:%d", ports[1]), "--link-transport", "websocket",
		"--link-auth-url", fmt.Sprintf("https://127.0.0.1:%d", ports[2]),
		"--link-bootstrap-token", tok.Token, "--link-ca-cert-hash", tok.CACertHash}}, nil
}

type processLink struct {
	demoLink
	agentArgs []string
}
