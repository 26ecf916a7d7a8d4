// Package pymodbus runs pymodbus (Debian's python3-pymodbus) as a Modbus
// RTU slave on a serial port for tests: rtu_server.py, run with Debian's
// /usr/bin/python3 (plain python3 on PATH may lack Debian's modules), serves
// the units and registers a test names, with the line settings it names,
// and is stopped by its pid when the test ends. Units it does not serve
// stay silent, as on a real bus.
package pymodbus

import (
	_ "embed"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

//go:embed rtu_server.py
var script []byte

// Python is Debian's interpreter, which sees python3-pymodbus.
const Python = "/usr/bin/python3"

// Unit is what one unit id serves: register address → value.
type Unit struct {
	Holding map[int]int `json:"holding,omitempty"`
	Input   map[int]int `json:"input,omitempty"`
}

// Config is one slave process on one serial port.
type Config struct {
	// Port is the serial device, e.g. one end of a nullmodem pair.
	Port string `json:"port"`
	// BaudRate (default 19200), DataBits (8), Parity ("N", "E" or "O";
	// default "E", the Modbus default) and StopBits (1).
	BaudRate int    `json:"baudRate,omitempty"`
	DataBits int    `json:"dataBits,omitempty"`
	Parity   string `json:"parity,omitempty"`
	StopBits int    `json:"stopBits,omitempty"`
	// Units are the unit ids served.
	Units map[int]Unit `json:"units"`
	// LogRequests prints a REQUEST line for each answered request.
	LogRequests bool `json:"logRequests,omitempty"`
}

// Server is a running slave.
type Server struct {
	Config
	Out  *procs.Lines
	proc *procs.Proc
}

// Check fails the test under CI=true, and skips it otherwise, when Debian's
// python3-pymodbus is not installed, saying how to install it.
func Check(t testing.TB) {
	t.Helper()
	if _, err := os.Stat(Python); err != nil {
		npmpeer.Unavailable(t, "%s not found: run hack/install-deps.sh (Debian python3 and python3-pymodbus)", Python)
	}
	if out, err := exec.Command(Python, "-c", "import pymodbus.server, serial").CombinedOutput(); err != nil {
		npmpeer.Unavailable(t, "pymodbus is not installed for %s: run hack/install-deps.sh (Debian python3-pymodbus): %v\n%s", Python, err, out)
	}
}

// StartRTU runs a slave with cfg and stops it when the test ends.
func StartRTU(t testing.TB, cfg Config) *Server {
	t.Helper()
	Check(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "rtu_server.py")
	if err := os.WriteFile(path, script, 0o600); err != nil {
		t.Fatal(err)
	}
	arg, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Config: cfg, Out: procs.NewLines()}
	p, err := procs.Run("pymodbus-rtu", Python, []string{path, string(arg)}, procs.Options{Stdout: s.Out, Stderr: s.Out, DieWithCaller: true})
	if err != nil {
		t.Fatal(err)
	}
	s.proc = p
	s.Out.EndWith(p)
	t.Cleanup(s.Stop)
	if _, _, err := s.Out.Wait("READY", 0, 20*time.Second); err != nil {
		s.Stop()
		t.Fatalf("pymodbus on %s did not start: %v\n%s", cfg.Port, err, s.Out)
	}
	return s
}

// Stop stops the slave (by its pid) and waits for it.
func (s *Server) Stop() {
	if s.proc != nil {
		s.proc.StopWithin(5 * time.Second)
	}
	s.proc = nil
}
