package npmpeer

import (
	"net"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/test/framework/kube"
)

// The pinned npm packages of the Modbus peers: jsmodbus's and
// modbus-serial's TCP servers, and modbus-serial's RTU server on a serial
// line (serialport's native bindings ship prebuilt in its package).
var (
	ModbusPackages       = []string{"jsmodbus@5.0.0", "modbus-serial@8.0.25"}
	ModbusSerialPackages = []string{"modbus-serial@8.0.25", "serialport@13.0.0"}
)

// ModbusScript is the launcher of the Modbus peers; its first lines say
// what its JSON config holds.
func ModbusScript() string {
	return filepath.Join(kube.RepoRoot(), "test", "peers", "npmpeer", "peers", "modbus-server.js")
}

// ModbusModules returns the Modbus peers' node_modules (installed by
// hack/install-npm-peers.sh); serial: those with serialport, for RTU.
func ModbusModules(t testing.TB, serial bool) string {
	t.Helper()
	if serial {
		return Installed(t, "modbus-rtu", ModbusSerialPackages...)
	}
	return Installed(t, "modbus", ModbusPackages...)
}

// ModbusServer is a running Modbus peer.
type ModbusServer struct {
	*Process
	// Address is host:port (empty for RTU on a serial line); Config is what
	// Restart runs it with.
	Address string
	name    string
	Config  map[string]any
	modules string
}

// StartModbus runs a Modbus peer with config (the launcher's keys: "impl",
// "host", "port", "serialPath", register tables...; a free "port" on "host"
// when it has none), waits until it listens and stops it when the test ends.
func StartModbus(t testing.TB, name string, config map[string]any) *ModbusServer {
	t.Helper()
	serial := config["serialPath"] != nil
	s := &ModbusServer{name: name, Config: config, modules: ModbusModules(t, serial)}
	if !serial {
		host, _ := config["host"].(string)
		if _, ok := config["port"]; !ok {
			config["port"] = FreePort(t, host)
		}
		s.Address = net.JoinHostPort(host, strconv.Itoa(config["port"].(int)))
	}
	s.Restart(t)
	return s
}

// Restart runs the peer again with the same config (after Stop, or to
// replace it) and waits until it listens.
func (s *ModbusServer) Restart(t testing.TB) {
	t.Helper()
	if s.Process != nil {
		s.Stop()
	}
	s.Process = Start(t, s.name, s.modules, ModbusScript(), JSON(t, s.Config))
	s.WaitLine(t, "READY", 0, 30*time.Second)
}
