package node

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	dp "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"

	"github.com/dowse-dev/dowse/test/framework/cluster"
)

const (
	testResource = "dowse.dev/node-test"
	cdiKind      = "dowse.dev/node-test"
)

// throwawayPlugin serves one healthy device and answers Allocate with an env
// var, a device node and a CDI device: the three ways the agent's plugins hand
// a device to a container.
type throwawayPlugin struct {
	dp.UnimplementedDevicePluginServer
	stop chan struct{}
}

func (p *throwawayPlugin) GetDevicePluginOptions(context.Context, *dp.Empty) (*dp.DevicePluginOptions, error) {
	return &dp.DevicePluginOptions{}, nil
}

func (p *throwawayPlugin) ListAndWatch(_ *dp.Empty, s grpc.ServerStreamingServer[dp.ListAndWatchResponse]) error {
	if err := s.Send(&dp.ListAndWatchResponse{Devices: []*dp.Device{{ID: "dev0", Health: dp.Healthy}}}); err != nil {
		return err
	}
	select {
	case <-p.stop:
	case <-s.Context().Done():
	}
	return nil
}

func (p *throwawayPlugin) Allocate(_ context.Context, req *dp.AllocateRequest) (*dp.AllocateResponse, error) {
	resp := &dp.AllocateResponse{}
	for range req.ContainerRequests {
		resp.ContainerResponses = append(resp.ContainerResponses, &dp.ContainerAllocateResponse{
			Envs:       map[string]string{"DOWSE_PLUGIN_ENV": "from-allocate"},
			Devices:    []*dp.DeviceSpec{{ContainerPath: "/dev/dowse-plugin", HostPath: "/dev/null", Permissions: "rw"}},
			CdiDevices: []*dp.CDIDevice{{Name: cdiKind + "=dev0"}},
		})
	}
	return resp, nil
}

func (p *throwawayPlugin) PreStartContainer(context.Context, *dp.PreStartContainerRequest) (*dp.PreStartContainerResponse, error) {
	return &dp.PreStartContainerResponse{}, nil
}

// cdiSpec is what containerd injects for cdiKind=dev0: an env var the plugin
// does not set and a device node the plugin does not name.
const cdiSpec = `{
  "cdiVersion": "0.6.0",
  "kind": "` + cdiKind + `",
  "devices": [{
    "name": "dev0",
    "containerEdits": {
      "env": ["DOWSE_CDI_ENV=from-cdi-spec"],
      "deviceNodes": [{"path": "/dev/dowse-cdi", "hostPath": "/dev/zero"}]
    }
  }]
}
`

func testDevicePlugin(t *testing.T, ctx context.Context, c *cluster.Cluster) {
	if err := os.WriteFile(filepath.Join(c.CDIDir, "dowse-node-test.json"), []byte(cdiSpec), 0o644); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(cluster.DevicePluginDir, fmt.Sprintf("dowse-node-test-%d.sock", os.Getpid()))
	_ = os.Remove(sock)
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	plugin := &throwawayPlugin{stop: make(chan struct{})}
	srv := grpc.NewServer()
	dp.RegisterDevicePluginServer(srv, plugin)
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() {
		close(plugin.stop)
		srv.Stop()
		_ = os.Remove(sock)
	})

	conn, err := grpc.NewClient("unix://"+dp.KubeletSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := dp.NewRegistrationClient(conn).Register(ctx, &dp.RegisterRequest{
		Version: dp.Version, Endpoint: filepath.Base(sock), ResourceName: testResource,
	}); err != nil {
		t.Fatalf("registering with the kubelet: %v", err)
	}

	// The kubelet reports the device in the node's allocatable resources.
	for {
		n, err := c.Client.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if q, ok := n.Status.Allocatable[testResource]; ok && q.Value() == 1 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("node never offered %s: %v", testResource, n.Status.Allocatable)
		}
		time.Sleep(200 * time.Millisecond)
	}

	pod := probePod("device-user", "env:DOWSE_PLUGIN_ENV", "dev:/dev/dowse-plugin", "env:DOWSE_CDI_ENV", "dev:/dev/dowse-cdi")
	pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{testResource: resource.MustParse("1")}
	pods := c.Client.CoreV1().Pods("default")
	if _, err := pods.Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p := waitPodPhase(t, ctx, c.Client, "device-user", corev1.PodSucceeded, corev1.PodFailed)
	logs := podLogs(t, ctx, c.Client, "device-user")
	if p.Status.Phase != corev1.PodSucceeded {
		t.Fatalf("pod failed: %+v\nlogs: %s", p.Status, logs)
	}
	for _, want := range []string{
		"env DOWSE_PLUGIN_ENV=from-allocate", // Allocate's env
		"dev /dev/dowse-plugin char",         // Allocate's device node
		"env DOWSE_CDI_ENV=from-cdi-spec",    // the CDI spec, via Allocate's CDI device
		"dev /dev/dowse-cdi char",
	} {
		if !strings.Contains(logs, want) {
			t.Errorf("pod logs lack %q:\n%s", want, logs)
		}
	}
	if err := pods.Delete(ctx, "device-user", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}
