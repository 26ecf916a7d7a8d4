package dmi_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/dowse-dev/dowse/internal/link"
	"github.com/dowse-dev/dowse/internal/link/pki"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/test/framework/procs"
)

func newPKI(t testing.TB) (server, client *tls.Config) {
	t.Helper()
	ca, err := pki.NewCA("dowse-dmi-bench", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := ca.IssueServer([]string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := ca.IssueNode(node, "", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return pki.ServerTLSConfig(pki.Static[*tls.ClientHelloInfo](srv), ca.Pool()),
		pki.ClientTLSConfig(pki.Static[*tls.CertificateRequestInfo](cert), ca.Pool(), "127.0.0.1")
}

// timingMapper is a DeviceMapperService that notes when each desired temp
// value arrives.
type timingMapper struct {
	dmiv1beta1.UnimplementedDeviceMapperServiceServer
	got chan string
}

func (m *timingMapper) note(d *dmiv1beta1.Device) {
	for _, p := range d.GetSpec().GetProperties() {
		if p.GetName() == "temp" {
			select {
			case m.got <- p.GetDesired().GetValue():
			default:
			}
		}
	}
}

func (m *timingMapper) RegisterDevice(_ context.Context, r *dmiv1beta1.RegisterDeviceRequest) (*dmiv1beta1.RegisterDeviceResponse, error) {
	m.note(r.Device)
	return &dmiv1beta1.RegisterDeviceResponse{}, nil
}

func (m *timingMapper) UpdateDevice(_ context.Context, r *dmiv1beta1.UpdateDeviceRequest) (*dmiv1beta1.UpdateDeviceResponse, error) {
	m.note(r.Device)
	return &dmiv1beta1.UpdateDeviceResponse{}, nil
}

func (m *timingMapper) CreateDeviceModel(context.Context, *dmiv1beta1.CreateDeviceModelRequest) (*dmiv1beta1.CreateDeviceModelResponse, error) {
	return &dmiv1beta1.CreateDeviceModelResponse{}, nil
}

func (m *timingMapper) UpdateDeviceModel(context.Context, *dmiv1beta1.UpdateDeviceModelRequest) (*dmiv1beta1.UpdateDeviceModelResponse, error) {
	return &dmiv1beta1.UpdateDeviceModelResponse{}, nil
}

// BenchmarkDesiredToMapper is the edge's share of "desired set in
// Device.spec -> the mapper's UpdateDevice": from cloudhub.Send of a
// DeviceUpdate carrying a new desired value, over the link (WebSocket on
// loopback, mutual TLS), into the edge store (fsync), through internal/agent/dmi,
// to the mapper's UpdateDevice. One change at a time; p50 and p99 over
// b.N changes (run with -benchtime=100x for the issue's 100).
func BenchmarkDesiredToMapper(b *testing.B) {
	tmp := b.TempDir()
	serverTLS, clientTLS := newPKI(b)
	c := startCloud(b, serverTLS, "127.0.0.1:0")
	dialer, err := link.NewDialer(link.WebSocket, c.addr(), clientTLS)
	if err != nil {
		b.Fatal(err)
	}
	stateDir := filepath.Join(tmp, "state")
	a := startAgent(b, stateDir, dialer, procs.NewLines(), false)
	waitFor(b, "link up", func() error {
		if !a.hub.Connected() {
			return fmt.Errorf("not connected")
		}
		return nil
	})

	sock := filepath.Join(tmp, "m.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	tm := &timingMapper{got: make(chan string, 16)}
	gs := grpc.NewServer()
	dmiv1beta1.RegisterDeviceMapperServiceServer(gs, tm)
	go gs.Serve(lis)
	defer gs.Stop()
	conn, err := grpc.NewClient("unix://"+filepath.Join(stateDir, "dmi", "dmi.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	if _, err := dmiv1beta1.NewDeviceManagerServiceClient(conn).MapperRegister(context.Background(), &dmiv1beta1.MapperRegisterRequest{
		Mapper: &dmiv1beta1.MapperInfo{Name: "virtual-mapper", Protocol: "virtual", Address: []byte(sock)}}); err != nil {
		b.Fatal(err)
	}

	c.send(b, thermoModel())
	wait := func(want string) {
		for {
			select {
			case v := <-tm.got:
				if v == want {
					return
				}
			case <-time.After(30 * time.Second):
				b.Fatalf("desired %s never reached the mapper", want)
			}
		}
	}
	c.send(b, thermo1(b, 1, "0"))
	wait("0")
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		v := strconv.Itoa(i + 1)
		start := time.Now()
		c.send(b, thermo1(b, int64(i+2), v))
		wait(v)
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	q := func(p float64) float64 {
		return float64(lat[min(len(lat)-1, int(p*float64(len(lat))))].Microseconds()) / 1000
	}
	b.ReportMetric(q(0.50), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(0, "ns/op")
}
