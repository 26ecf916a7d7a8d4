package main

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

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
