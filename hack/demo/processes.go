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
	"github.com/dowse-dev/dowse/test/framework/dowse"
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
	link := &dowse.Link{WebSocket: ports[1], Auth: ports[2]}
	ctl, err := dowse.Controller{Kubeconfig: kubeconfig, Metrics: ports[0], Link: link}.Start(ps.logs)
	if err != nil {
		return nil, err
	}
	ps.ps = append(ps.ps, ctl)
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
	edge := link.Edge("websocket")
	edge.BootstrapToken, edge.CACertHash = tok.Token, tok.CACertHash
	return &processLink{demoLink: demoLink{metricsPort: ports[0], how: "the bootstrap token"}, edge: edge}, nil
}

type processLink struct {
	demoLink
	edge *dowse.AgentLink
}
