package integration

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// TestSharedInstancePathsComeFromEachNode: a shared Instance is one object
// that every node seeing the device writes. Node A's agent credentials
// rewrite its mounts and device nodes to the host's root; node B's CDI spec
// keeps what B's own handler reported, so a broker on B gets nothing of B's
// host that B's handler did not hand out.
func TestSharedInstancePathsComeFromEachNode(t *testing.T) {
	ns := suite.Namespace(t)
	const nodeA, nodeB = "paths-node-a", "paths-node-b"
	cam := func() []*discoveryv1.Device {
		d := devices("cam-1")
		d[0].Mounts = []*discoveryv1.Mount{{ContainerPath: "/data", HostPath: "/dev/dowse-cam", ReadOnly: true}}
		return d
	}
	cdiDirs := map[string]string{}
	for _, n := range []string{nodeA, nodeB} {
		createNode(t, n, true, time.Now())
		cdiDirs[n] = t.TempDir()
		a := startAgent(t, n, stateDir(t), withDevicePlugins(startRegistrar(t), cdiDirs[n]))
		startScripted(t, a.stateDir, "paths-cams", true, cam())
	}
	createConfiguration(t, ns, "cams", "paths-cams", `{}`)
	key := types.NamespacedName{Namespace: ns, Name: v1alpha1.InstanceName("cams", v1alpha1.DeviceHash("cam-1", true, ""))}
	inst := &v1alpha1.Instance{ObjectMeta: metavOf(key)}
	mountsOnB := func() ([]string, error) {
		c, err := cdiapi.NewCache(cdiapi.WithSpecDirs(cdiDirs[nodeB]), cdiapi.WithAutoRefresh(false))
		if err != nil {
			return nil, err
		}
		dev := c.GetDevice(inst.CDIName())
		if dev == nil {
			return nil, fmt.Errorf("node B has no CDI device %s (has %v)", inst.CDIName(), c.ListDevices())
		}
		var out []string
		for _, m := range dev.ContainerEdits.Mounts {
			out = append(out, m.HostPath+":"+m.ContainerPath)
		}
		for _, d := range dev.ContainerEdits.DeviceNodes {
			out = append(out, d.HostPath+":"+d.Path)
		}
		return out, nil
	}
	testwait.For(t, 30*time.Second, func() error {
		if err := suite.Client.Get(context.Background(), key, inst); err != nil {
			return err
		}
		if !inst.HasNode(nodeA) || !inst.HasNode(nodeB) {
			return fmt.Errorf("instance nodes %v, want both", inst.Status.Nodes)
		}
		got, err := mountsOnB()
		if err != nil {
			return err
		}
		if len(got) != 1 || got[0] != "/dev/dowse-cam:/data" {
			return fmt.Errorf("node B's spec mounts %v", got)
		}
		return nil
	})

	// Node A, under its own agent credentials, puts the host's root and
	// memory into the shared object: the node policy refuses it.
	asA, err := client.New(agentConfig(t, nodeA), client.Options{Scheme: suite.Client.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	patch := client.RawPatch(types.MergePatchType, []byte(`{"spec":{"mounts":[{"containerPath":"/host","hostPath":"/"}],"deviceSpecs":[{"containerPath":"/dev/mem","hostPath":"/dev/mem","permissions":"rw"}]}}`))
	if err := asA.Patch(context.Background(), &v1alpha1.Instance{ObjectMeta: metavOf(key)}, patch); err == nil || !strings.Contains(err.Error(), "instance-shared-host-paths") {
		t.Fatalf("node A's rewrite of the shared Instance: %v, want the node policy's refusal", err)
	}
	// Written past the policy (by an administrator, or with the policy
	// off), it still reaches no other node's containers.
	if err := suite.Client.Patch(context.Background(), &v1alpha1.Instance{ObjectMeta: metavOf(key)}, patch); err != nil {
		t.Fatal(err)
	}
	if err := suite.Client.Get(context.Background(), key, inst); err != nil || len(inst.Spec.Mounts) != 1 || inst.Spec.Mounts[0].HostPath != "/" {
		t.Fatalf("the object after the rewrite: %+v %v", inst.Spec.Mounts, err)
	}
	// Node B sees the change (its device plugin reconciles it) and keeps
	// its own paths.
	testwait.Holds(t, 5*time.Second, func() error {
		got, err := mountsOnB()
		if err != nil {
			return err
		}
		if len(got) != 1 || got[0] != "/dev/dowse-cam:/data" {
			return fmt.Errorf("node B's CDI spec follows node A's rewrite: %v", got)
		}
		return nil
	})
}

func metavOf(key types.NamespacedName) metav1.ObjectMeta {
	return metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}
}
