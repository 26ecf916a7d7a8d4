package e2e

// What the readings API's tests share: the APIService, simulated edges
// and their counters.

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/link/pki"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	readingsv1 "github.com/dowse-dev/dowse/shared/api/readings/v1alpha1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// registerReadingsAPI registers the readings API with the API server's
// aggregator as the chart does, reaching front, and waits until it is
// Available under the link CA the replicas keep in its caBundle, which
// it returns.
func registerReadingsAPI(t *testing.T, ctx context.Context, f *fleet, front *replica) *pki.CA {
	t.Helper()
	// The API: an ExternalName Service reaching replica 0 on loopback (no
	// kube-proxy here) and the APIService the chart registers; its
	// caBundle is the replicas' to set.
	if err := f.client.Create(ctx, &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: "dowse-system", Name: readingsService},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost",
			Ports: []corev1.ServicePort{{Name: "https", Port: int32(front.readings)}}}}); err != nil {
		t.Fatal(err)
	}
	apiSvc := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
		"metadata": map[string]any{"name": readingsv1.APIServiceName},
		"spec": map[string]any{"group": readingsv1.Group, "version": readingsv1.Version,
			"groupPriorityMinimum": int64(1000), "versionPriority": int64(15),
			"service": map[string]any{"namespace": "dowse-system", "name": readingsService, "port": int64(front.readings)}},
	}}
	if err := f.client.Create(ctx, apiSvc); err != nil {
		t.Fatal(err)
	}
	var caSecret corev1.Secret
	testwait.For(t, 30*time.Second, func() error {
		return f.client.Get(ctx, client.ObjectKey{Namespace: "dowse-system", Name: "dowse-link-ca"}, &caSecret)
	})
	ca, err := pki.LoadCA(caSecret.Data[corev1.TLSCertKey], caSecret.Data[corev1.TLSPrivateKeyKey])
	if err != nil {
		t.Fatal(err)
	}
	testwait.For(t, time.Minute, func() error {
		got := &unstructured.Unstructured{}
		got.SetAPIVersion("apiregistration.k8s.io/v1")
		got.SetKind("APIService")
		if err := f.client.Get(ctx, client.ObjectKey{Name: readingsv1.APIServiceName}, got); err != nil {
			return err
		}
		b64, _, _ := unstructured.NestedString(got.Object, "spec", "caBundle")
		if b, _ := base64.StdEncoding.DecodeString(b64); !bytes.Equal(b, ca.CertPEM) {
			return errors.New("the APIService's caBundle is not the link CA yet")
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, cd := range conds {
			m, _ := cd.(map[string]any)
			if m["type"] == "Available" {
				if m["status"] == "True" {
					return nil
				}
				return fmt.Errorf("APIService not available: %v: %v", m["reason"], m["message"])
			}
		}
		return errors.New("APIService has no Available condition")
	})

	return ca
}

// startCounterEdges makes a counter DeviceModel, nodes rd-<n> with
// perNode Devices rd-<n>-<i> each in default, and a simulated edge per
// node connected to the replicas; it waits until every edge has a
// session.
func startCounterEdges(t *testing.T, ctx context.Context, f *fleet, ca *pki.CA, nodes, perNode int) ([]*simEdge, func(n, i int) string) {
	t.Helper()
	model := &v1alpha1.DeviceModel{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "counter"},
		Spec: v1alpha1.DeviceModelSpec{Protocol: "scripted", Properties: []v1alpha1.ModelProperty{{Name: "count", Type: v1alpha1.PropertyInt}}}}
	if err := f.client.Create(ctx, model); err != nil {
		t.Fatal(err)
	}
	nodeName := func(n int) string { return fmt.Sprintf("rd-%d", n) }
	devName := func(n, i int) string { return fmt.Sprintf("rd-%d-%d", n, i) }
	for n := range nodes {
		if err := f.client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName(n)}}); err != nil {
			t.Fatal(err)
		}
		for i := range perNode {
			if err := f.client.Create(ctx, &v1alpha1.Device{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: devName(n, i)},
				Spec: v1alpha1.DeviceSpec{DeviceModelRef: &corev1.LocalObjectReference{Name: "counter"}, NodeName: nodeName(n)}}); err != nil {
				t.Fatal(err)
			}
		}
	}
	names := make([]string, nodes)
	for n := range names {
		names[n] = nodeName(n)
	}
	edges := connectSimEdges(t, ctx, f, ca, names, perNode, time.Second, nil)
	return edges, devName
}

// reportCounters has every edge report each of its Devices' counter, one
// up every 200 ms, until the function it returns is called.
func reportCounters(edges []*simEdge, perNode int, devName func(n, i int) string) func() {
	rctx, stopReports := context.WithCancel(context.Background())
	var reporters sync.WaitGroup
	for n, e := range edges {
		for i := range perNode {
			ref := &linkv1.DeviceRef{Namespace: "default", Name: devName(n, i)}
			reporters.Go(func() {
				tick := time.NewTicker(200 * time.Millisecond)
				defer tick.Stop()
				for {
					v := e.count[i].Load() + 1
					if _, err := e.hub.Report(ref, "count", &linkv1.TwinValue{Value: strconv.FormatInt(v, 10)}, time.Now()); err == nil {
						e.count[i].Store(v)
					}
					select {
					case <-tick.C:
					case <-rctx.Done():
						return
					}
				}
			})
		}
	}
	return func() { stopReports(); reporters.Wait() }
}
