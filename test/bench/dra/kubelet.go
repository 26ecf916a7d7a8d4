package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	dp "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// kubeletEnv, set to a device-plugin directory, makes the bench binary a
// kubelet's device manager as far as the agent's plugins see it (a process
// of its own, so that its side of every connection is not the agent's):
// it takes each registration, dials the plugin back and keeps its
// ListAndWatch stream open, as the kubelet does, and writes how many
// streams it holds to <dir>/streams.
const kubeletEnv = "DOWSE_BENCH_KUBELET_DIR"

func runKubelet(dir string) error {
	l, err := net.Listen("unix", filepath.Join(dir, "kubelet.sock"))
	if err != nil {
		return err
	}
	k := &benchKubelet{dir: dir}
	go func() {
		for range time.Tick(200 * time.Millisecond) {
			_ = os.WriteFile(filepath.Join(dir, "streams.tmp"), []byte(strconv.FormatInt(k.streams.Load(), 10)), 0o644)
			_ = os.Rename(filepath.Join(dir, "streams.tmp"), filepath.Join(dir, "streams"))
		}
	}()
	srv := grpc.NewServer()
	dp.RegisterRegistrationServer(srv, k)
	return srv.Serve(l)
}

type benchKubelet struct {
	dp.UnimplementedRegistrationServer
	dir     string
	streams atomic.Int64
}

func (k *benchKubelet) Register(_ context.Context, r *dp.RegisterRequest) (*dp.Empty, error) {
	// The kubelet dials the plugin before it answers.
	conn, err := grpc.NewClient("unix://"+filepath.Join(k.dir, r.Endpoint), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	s, err := dp.NewDevicePluginClient(conn).ListAndWatch(context.Background(), &dp.Empty{})
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	go func() {
		defer conn.Close()
		if _, err := s.Recv(); err != nil {
			return
		}
		k.streams.Add(1)
		defer k.streams.Add(-1)
		for {
			if _, err := s.Recv(); err != nil {
				return
			}
		}
	}()
	return &dp.Empty{}, nil
}

// kubeletStreams reads how many ListAndWatch streams the bench kubelet in
// dir holds.
func kubeletStreams(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, "streams"))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// startKubelet runs the bench binary as a kubelet of dir.
func startKubelet(dir string) (stop func(), err error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	p, err := os.StartProcess(self, []string{self}, &os.ProcAttr{Env: append(os.Environ(), kubeletEnv+"="+dir), Files: []*os.File{nil, os.Stdout, os.Stderr}})
	if err != nil {
		return nil, err
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if _, err := os.Stat(filepath.Join(dir, "kubelet.sock")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			_ = p.Kill()
			_, _ = p.Wait()
			return nil, fmt.Errorf("the bench kubelet never listened on %s", dir)
		}
	}
	return func() { _ = p.Kill(); _, _ = p.Wait() }, nil
}
