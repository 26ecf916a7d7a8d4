package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/dowse-dev/dowse/mappers/mapper/mappertest"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/test/framework/procs"
)

// runONVIF measures dowse-onvif-mapper against go2rtc (bin/peers/go2rtc,
// from make peers): property reads a second of one camera polling its
// model, stream URI, snapshot URI and clock at a 1 ms cycle (five SOAP
// calls a round: GetProfiles is asked once), and peak RSS.
func runONVIF(ctx context.Context, root string, window time.Duration) error {
	bin := filepath.Join(root, "bin", "peers", "go2rtc")
	if _, err := os.Stat(bin); err != nil {
		fmt.Println("ONVIF skipped: bin/peers/go2rtc is missing (make peers builds it)")
		return nil
	}
	if _, err := os.Stat(filepath.Join(procs.BinDir(), "dowse-onvif-mapper")); err != nil {
		return fmt.Errorf("bin/dowse-onvif-mapper is missing: run make build")
	}
	dir, err := os.MkdirTemp("", "dowse-vb")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	api, err := procs.FreePort()
	if err != nil {
		return err
	}
	rtsp, err := procs.FreePort()
	if err != nil {
		return err
	}
	cfgFile := filepath.Join(dir, "go2rtc.yaml")
	if err := os.WriteFile(cfgFile, []byte(fmt.Sprintf("api:\n  listen: \"127.0.0.1:%d\"\nrtsp:\n  listen: \"127.0.0.1:%d\"\nwebrtc:\n  listen: \"\"\nstreams:\n  gate: exec:true\n", api, rtsp)), 0o600); err != nil {
		return err
	}
	cam := exec.Command(bin, "-config", cfgFile)
	cam.Dir = dir
	cam.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cam.Start(); err != nil {
		return err
	}
	defer func() {
		_ = cam.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cam.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cam.Process.Kill()
			<-done
		}
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(api), time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("go2rtc not listening: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}

	agent := mappertest.NewAgent(filepath.Join(dir, "dmi", "dmi.sock"))
	if err := agent.Listen(); err != nil {
		return err
	}
	defer agent.Close()
	m, metrics, stopMapper, err := startMapper(dir, "dowse-onvif-mapper")
	if err != nil {
		return err
	}
	defer stopMapper()
	if err := awaitRegistration(agent, m); err != nil {
		return err
	}
	client, err := agent.MapperClient()
	if err != nil {
		return err
	}
	fields := []string{"model", "streamUri", "snapshotUri", "systemDateTime"}
	var mprops []*dmiv1beta1.ModelProperty
	var props []mappertest.Prop
	for _, f := range fields {
		mprops = append(mprops, mappertest.ModelProp(f, "STRING", "ReadOnly", "", ""))
		props = append(props, mappertest.Prop{Name: f, CollectCycle: time.Millisecond, Visitor: map[string]any{"field": f}})
	}
	if _, err := client.CreateDeviceModel(ctx, &dmiv1beta1.CreateDeviceModelRequest{Model: mappertest.NewModel("bench", "camera", mprops...)}); err != nil {
		return err
	}
	dev, err := mappertest.MakeDevice("bench", "cam", "camera", "onvif",
		map[string]any{"deviceServiceUrl": fmt.Sprintf("http://127.0.0.1:%d/onvif/device_service", api), "username": "admin", "password": "secret"}, props...)
	if err != nil {
		return err
	}
	if _, err := client.RegisterDevice(ctx, &dmiv1beta1.RegisterDeviceRequest{Device: dev}); err != nil {
		return err
	}
	deadline = time.Now().Add(30 * time.Second)
	for len(agent.Twins("bench/cam", "model", 0)) == 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("the camera never reported (log: %s)", mapperLog)
		}
		time.Sleep(50 * time.Millisecond)
	}
	ok0, _ := counter(metrics, `dowse_mapper_reads_total{result="ok"}`)
	start := time.Now()
	time.Sleep(window)
	ok1, _ := counter(metrics, `dowse_mapper_reads_total{result="ok"}`)
	fmt.Printf("ONVIF reads/s, one camera (4 fields, 5 SOAP calls a round with WS-Security, collect cycle 1 ms): %.0f\n", (ok1-ok0)/time.Since(start).Seconds())
	kib, err := m.PeakRSS()
	if err != nil {
		return err
	}
	now, _ := m.MemoryNow()
	fmt.Printf("ONVIF mapper peak RSS (VmHWM): %.1f MiB (now %.1f MiB, %.1f MiB anonymous)\n", float64(kib)/1024, float64(now.RSS)/1024, float64(now.Anon)/1024)
	return nil
}
