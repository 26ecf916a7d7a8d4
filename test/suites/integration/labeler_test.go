package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dowse-dev/dowse/agent"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// TestOldInstancesAreLabelledOnStart: an Instance an agent wrote before the
// node label existed (it lists the node, without the label) is labelled by
// the upgraded agent when it starts, under the node policy, so that the
// agent sees it: its device is gone, and the agent releases it. Another
// node's Instance is left alone; the state directory records that it is
// done.
func TestOldInstancesAreLabelledOnStart(t *testing.T) {
	ns := suite.Namespace(t)
	ctx := context.Background()
	old := func(name, node string) *v1alpha1.Instance {
		t.Helper()
		// No status subresource: the status is written with the object.
		inst := &v1alpha1.Instance{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec:   v1alpha1.InstanceSpec{ConfigurationName: "old", DeviceID: name, Shared: true},
			Status: v1alpha1.InstanceStatus{Nodes: []v1alpha1.InstanceNode{{Name: node}}}}
		if err := suite.Client.Create(ctx, inst); err != nil {
			t.Fatal(err)
		}
		return inst
	}
	mine := old(v1alpha1.InstanceName("old", v1alpha1.DeviceHash("gone", true, "")), "label-node-a")
	theirs := old(v1alpha1.InstanceName("old", v1alpha1.DeviceHash("elsewhere", true, "")), "label-node-b")
	dir := stateDir(t)
	startAgent(t, "label-node-a", dir)
	startScripted(t, dir, "label-old", true, devices("present"))
	createConfiguration(t, ns, "old", "label-old", `{}`)
	testwait.For(t, 30*time.Second, func() error {
		var cur v1alpha1.Instance
		err := suite.Client.Get(ctx, keyOf(ns, mine.Name), &cur)
		if apierrors.IsNotFound(err) {
			return nil
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("the old Instance of a device no longer seen is still there (labels %v)", cur.Labels)
	})
	var cur v1alpha1.Instance
	if err := suite.Client.Get(ctx, keyOf(ns, theirs.Name), &cur); err != nil || len(cur.Labels) != 0 {
		t.Fatalf("another node's Instance: %v, labels %v", err, cur.Labels)
	}
	// The agent releases the Instance as soon as the label shows it,
	// which may be before the labeller has finished and written its
	// marker.
	testwait.For(t, 30*time.Second, func() error {
		_, err := os.Stat(filepath.Join(dir, agent.InstancesLabelledMarker))
		return err
	})
}
