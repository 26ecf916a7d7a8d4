package snmp_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/mappers/mapper/mappertest"
	"github.com/dowse-dev/dowse/mappers/snmp"
	dmiv1beta1 "github.com/dowse-dev/dowse/proto/dmi/v1beta1"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/peers/snmpd"
)

// TestBinaryPeakRSS runs the real dowse-snmp-mapper binary serving ten
// Devices of one snmpd (every property of the system group, read every
// 100 ms) and reports its peak resident memory (goal: under 16 MiB). It
// fails only above maxPeakRSS, a regression bound.
func TestBinaryPeakRSS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	peer := snmpd.Start(t, snmpd.Config{SysDescr: "Dowse test agent", SysObjectID: ".1.3.6.1.4.1.8072.3.2.10", SysServices: 72})
	bin := filepath.Join(t.TempDir(), "dowse-snmp-mapper")
	// Built as its image is (make images).
	build := exec.Command("go", "build", "-tags", "grpcnotrace", "-trimpath", "-ldflags=-s -w", "-o", bin, "./cmd/dowse-snmp-mapper")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	dir := mappertest.ShortTempDir(t)
	agent := mappertest.Start(t, dir)
	var devs []*dmiv1beta1.Device
	for i := range 10 {
		devs = append(devs, mappertest.NewDevice(t, "default", "agent-"+strconv.Itoa(i), "agent", snmp.Protocol,
			map[string]any{"address": peer.Addr()}, agentProps()...))
	}
	agent.SetData([]*dmiv1beta1.DeviceModel{agentModel}, devs)
	p, err := procs.Run("dowse-snmp-mapper", bin, []string{"--state-dir", dir, "--name", snmp.Protocol}, procs.Options{DieWithCaller: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	for _, d := range devs {
		agent.WaitReported(t, "default/"+d.GetName(), "descr", "Dowse test agent", 0, wait)
	}
	time.Sleep(2 * time.Second)
	hwm, err := p.PeakRSS()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("FIGURE: dowse-snmp-mapper peak RSS, 10 devices of 7 properties each read every 100 ms: %.1f MiB", float64(hwm)/1024)
	if hwm > maxPeakRSS {
		t.Errorf("peak RSS %d KiB, more than the %d KiB regression bound", hwm, maxPeakRSS)
	}
}

// maxPeakRSS is the regression bound of TestBinaryPeakRSS, in KiB.
const maxPeakRSS = 20 * 1024
