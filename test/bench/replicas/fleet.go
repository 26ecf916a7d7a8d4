package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/agent/edgehub"
	"github.com/dowse-dev/dowse/internal/link/pki"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// devName names Device i of edge e.
func devName(e, i int) string { return fmt.Sprintf("node-%d-dev-%d", e, i) }

// createFleet creates the DeviceModel "bench" with props in default, and
// nEdges Nodes node-<e>, each with perEdge Devices of that model.
func createFleet(ctx context.Context, c client.Client, nEdges, perEdge int, props ...v1alpha1.ModelProperty) error {
	t0 := time.Now()
	model := &v1alpha1.DeviceModel{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "bench"},
		Spec: v1alpha1.DeviceModelSpec{Protocol: "scripted", Properties: props}}
	if err := c.Create(ctx, model); err != nil {
		return err
	}
	var g errgroup.Group
	g.SetLimit(32)
	for e := range nEdges {
		g.Go(func() error {
			node := fmt.Sprintf("node-%d", e)
			if err := c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}); err != nil {
				return err
			}
			for i := range perEdge {
				if err := c.Create(ctx, &v1alpha1.Device{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: devName(e, i)},
					Spec: v1alpha1.DeviceSpec{DeviceModelRef: &corev1.LocalObjectReference{Name: "bench"}, NodeName: node}}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	fmt.Printf("%d Nodes and %d Devices created in %s\n", nEdges, nEdges*perEdge, time.Since(t0).Round(time.Second))
	return nil
}

// startBudgetEdges starts nEdges simulated edges over WebSocket, edge k
// with the Devices devName(k, 0..perEdge-1), each given every replica's
// address and starting at one of them in turn, and waits until each has a
// session. onMessage, when not nil, makes an edge's handler of what the
// cloud sends. stop ends the edges that started; call it even on an error.
func (b *bench) startBudgetEdges(ctx context.Context, ca *pki.CA, nEdges, perEdge int, onMessage func(*budgetEdge) edgehub.OnMessage) (edges []*budgetEdge, stop func(), err error) {
	var servers []string
	for _, r := range b.replicas {
		servers = append(servers, fmt.Sprintf("127.0.0.1:%d", r.ws))
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca.Cert)
	ectx, ecancel := context.WithCancel(ctx)
	edges = make([]*budgetEdge, nEdges)
	stop = func() {
		ecancel()
		for _, e := range edges {
			if e != nil {
				<-e.done
				_ = e.hub.Close()
			}
		}
	}
	var g errgroup.Group
	g.SetLimit(runtime.NumCPU())
	for k := range nEdges {
		g.Go(func() error {
			e := &budgetEdge{node: fmt.Sprintf("node-%d", k), counter: make([]atomic.Int64, perEdge), done: make(chan struct{})}
			for i := range perEdge {
				e.devs = append(e.devs, &linkv1.DeviceRef{Namespace: "default", Name: devName(k, i)})
			}
			cert, err := ca.IssueNode(e.node, "", 24*time.Hour)
			if err != nil {
				return err
			}
			dir := filepath.Join(b.dir, "edges", e.node)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
			var handle edgehub.OnMessage
			if onMessage != nil {
				handle = onMessage(e)
			}
			h, err := edgehub.New(edgehub.Config{Node: e.node, Transport: "websocket", Server: servers[k%len(servers)], Servers: servers,
				TLS:      pki.ClientTLSConfig(pki.Static[*tls.CertificateRequestInfo](cert), pool, "127.0.0.1"),
				StateDir: dir, NoSync: true, Heartbeat: 5 * time.Second, BackoffMax: 2 * time.Second}, handle, nil)
			if err != nil {
				return err
			}
			e.hub = h
			edges[k] = e
			go func() {
				defer close(e.done)
				_ = h.Start(logr.NewContext(ectx, logr.Discard()))
			}()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, stop, err
	}
	for t1 := time.Now(); ; time.Sleep(100 * time.Millisecond) {
		missing := 0
		for _, e := range edges {
			if !e.hub.Connected() {
				missing++
			}
		}
		if missing == 0 {
			return edges, stop, nil
		}
		if time.Since(t1) > 5*time.Minute {
			return nil, stop, fmt.Errorf("%d edges without a session after 5 minutes", missing)
		}
	}
}
