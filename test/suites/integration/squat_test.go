package integration

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// TestHandlerNameStaysWithItsLiveProcess: a second process registering a
// handler name another live process holds (its devices offline, so that a
// takeover would show) is refused and changes nothing; once the first one
// dies, a process may take the name, as a restarted handler does.
func TestHandlerNameStaysWithItsLiveProcess(t *testing.T) {
	ns := suite.Namespace(t)
	a := startAgent(t, "node-a", stateDir(t))
	dir := t.TempDir()
	offline := filepath.Join(dir, "offline")
	if err := os.WriteFile(offline, []byte("OFFLINE"), 0o600); err != nil {
		t.Fatal(err)
	}
	first := procs.StartLogged(t, dir, "dowse-debug-echo-discovery", "first", "--state-dir", a.stateDir, "--name", "echo-owned",
		"--availability-file", filepath.Join(dir, "online"))
	createConfiguration(t, ns, "owned", "echo-owned", `{"descriptions":["foo0"]}`)
	present := func() error {
		if got := listInstances(t, ns, "owned"); len(got) != 1 {
			return fmt.Errorf("instances %v, want the first handler's one", got)
		}
		return nil
	}
	testwait.For(t, 30*time.Second, present)

	procs.StartLogged(t, dir, "dowse-debug-echo-discovery", "squatter", "--state-dir", a.stateDir, "--name", "echo-owned",
		"--availability-file", offline)
	testwait.For(t, 30*time.Second, func() error {
		b, _ := os.ReadFile(filepath.Join(dir, "squatter.log"))
		if !bytes.Contains(b, []byte("PermissionDenied")) || !bytes.Contains(b, []byte("still serves")) {
			return fmt.Errorf("the squatter was not refused:\n%s", b)
		}
		return nil
	})
	testwait.Holds(t, 3*time.Second, present)

	first.Kill()
	testwait.For(t, 90*time.Second, func() error {
		if got := listInstances(t, ns, "owned"); len(got) != 0 {
			return fmt.Errorf("instances %v: the second process has not taken the name after the first died", got)
		}
		return nil
	})
}
