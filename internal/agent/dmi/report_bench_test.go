package dmi

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/dowse-dev/dowse/internal/agent/edgehub"
	"github.com/dowse-dev/dowse/internal/link"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
)

// assigned is the real edge store with a Device and model assigned
// without a link.
type assigned struct {
	*edgehub.EdgeHub
	model  *linkv1.EdgeDeviceModel
	device *linkv1.EdgeDevice
}

func (a *assigned) Devices() ([]*linkv1.EdgeDevice, error) {
	return []*linkv1.EdgeDevice{a.device}, nil
}

func (a *assigned) Models() ([]*linkv1.EdgeDeviceModel, error) {
	return []*linkv1.EdgeDeviceModel{a.model}, nil
}

type offline struct{}

func (offline) Dial(context.Context) (link.Conn, error) { return nil, errors.New("offline") }

// BenchmarkReportDeviceStatus is the rate at which the agent takes
// mapper reports over dmi.sock into the real edge store (one property per
// request, as mapper-framework sends them, from 32 concurrent clients:
// distinct properties, so nothing coalesces). With fsync the edgehub
// commits what arrives meanwhile in one bbolt transaction (group commit).
func BenchmarkReportDeviceStatus(b *testing.B) {
	for _, noSync := range []bool{false, true} {
		b.Run(map[bool]string{false: "fsync", true: "nosync"}[noSync], func(b *testing.B) {
			dir := b.TempDir()
			hub, err := edgehub.New(edgehub.Config{Node: "edge", StateDir: dir, Dialer: offline{}, NoSync: noSync, StoreMaxEntries: 1 << 30, StoreMaxBytes: 1 << 40}, nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer hub.Close()
			props := make([]*linkv1.EdgeModelProperty, 0, 1000)
			for i := range 1000 {
				props = append(props, &linkv1.EdgeModelProperty{Name: "p" + strconv.Itoa(i), Type: "INT"})
			}
			edge := &assigned{EdgeHub: hub,
				model:  &linkv1.EdgeDeviceModel{Ref: &linkv1.DeviceRef{Namespace: "default", Name: "m"}, Protocol: "virtual", Properties: props},
				device: &linkv1.EdgeDevice{Ref: &linkv1.DeviceRef{Namespace: "default", Name: "d"}, Model: "m", ProtocolName: "virtual"}}
			srv, err := New(Config{StateDir: dir, Node: "edge", ReportRate: -1}, edge, nil)
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- srv.Start(ctx) }()
			defer func() { cancel(); <-done }()
			conn, err := grpc.NewClient("unix://"+filepath.Join(dir, "dmi", "dmi.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			c := dmiv1beta1.NewDeviceManagerServiceClient(conn)
			// Wait for the socket.
			for {
				if _, err := c.ReportDeviceStates(ctx, &dmiv1beta1.ReportDeviceStatesRequest{DeviceNamespace: "default", DeviceName: "d", State: "ok"}, grpc.WaitForReady(true)); err == nil {
					break
				}
			}
			var n atomic.Int64
			b.SetParallelism(16) // x GOMAXPROCS goroutines: many mappers, or one goroutine per property as mapper-framework runs them
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					i := n.Add(1)
					_, err := c.ReportDeviceStatus(ctx, &dmiv1beta1.ReportDeviceStatusRequest{DeviceNamespace: "default", DeviceName: "d",
						ReportedDevice: &dmiv1beta1.DeviceStatus{Twins: []*dmiv1beta1.Twin{{PropertyName: fmt.Sprintf("p%d", i%1000),
							Reported: &dmiv1beta1.TwinProperty{Value: strconv.FormatInt(i, 10)}}}}})
					if err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reports/s")
		})
	}
}
