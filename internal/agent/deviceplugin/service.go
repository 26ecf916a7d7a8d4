package deviceplugin

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	dp "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// changes broadcasts "something changed" to any number of waiters: Wait
// returns a channel closed by the next Notify.
type changes struct {
	mu sync.Mutex
	ch chan struct{}
}

func newChanges() *changes { return &changes{ch: make(chan struct{})} }

func (c *changes) Wait() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ch
}

func (c *changes) Notify() {
	c.mu.Lock()
	close(c.ch)
	c.ch = make(chan struct{})
	c.mu.Unlock()
}

// service is the gRPC side of a plugin: it lists what devices() returns,
// again after every change, and answers Allocate with allocate. It holds
// no state of its own, so a plugin served again after a kubelet restart
// offers exactly what it offered before.
type service struct {
	dp.UnimplementedDevicePluginServer
	devices  func() []*dp.Device
	allocate func(ctx context.Context, ids []string) (*dp.ContainerAllocateResponse, error)
	changed  *changes
	// stop, closed when the plugin goes away, ends every ListAndWatch, so
	// that the kubelet sees the stream end and marks the resource gone.
	stop chan struct{}
}

// newService makes a service of devices and allocate.
func newService(devices func() []*dp.Device, allocate func(ctx context.Context, ids []string) (*dp.ContainerAllocateResponse, error)) *service {
	return &service{devices: devices, allocate: allocate, changed: newChanges(), stop: make(chan struct{})}
}

func (s *service) GetDevicePluginOptions(context.Context, *dp.Empty) (*dp.DevicePluginOptions, error) {
	return &dp.DevicePluginOptions{}, nil
}

func (s *service) ListAndWatch(_ *dp.Empty, stream grpc.ServerStreamingServer[dp.ListAndWatchResponse]) error {
	for {
		// Wait before listing: a change between the list and the wait is
		// then never missed.
		next := s.changed.Wait()
		if err := stream.Send(&dp.ListAndWatchResponse{Devices: s.devices()}); err != nil {
			return err
		}
		select {
		case <-next:
		case <-s.stop:
			return nil
		case <-stream.Context().Done():
			return nil
		}
	}
}

func (s *service) Allocate(ctx context.Context, req *dp.AllocateRequest) (*dp.AllocateResponse, error) {
	resp := &dp.AllocateResponse{}
	for _, cr := range req.ContainerRequests {
		r, err := s.allocate(ctx, cr.DevicesIds)
		if err != nil {
			return nil, err
		}
		resp.ContainerResponses = append(resp.ContainerResponses, r)
	}
	return resp, nil
}

func (s *service) GetPreferredAllocation(context.Context, *dp.PreferredAllocationRequest) (*dp.PreferredAllocationResponse, error) {
	return &dp.PreferredAllocationResponse{}, nil
}

func (s *service) PreStartContainer(context.Context, *dp.PreStartContainerRequest) (*dp.PreStartContainerResponse, error) {
	return &dp.PreStartContainerResponse{}, nil
}
