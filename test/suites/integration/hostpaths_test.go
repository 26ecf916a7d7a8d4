package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// TestHandlerCannotHandOutTheHost: a handler (lying, or another process
// registered under its name) answers devices whose mounts and device nodes
// name the host's root and its secrets. With the agent's default allowlist
// (device nodes and mounts under /dev) those devices never become
// Instances, so no CDI spec or Allocate answer carries them; the
// Configuration's status names each with why, and the device under /dev of
// the same answer is taken.
func TestHandlerCannotHandOutTheHost(t *testing.T) {
	ns := suite.Namespace(t)
	a := startAgent(t, "node-a", stateDir(t))
	startScripted(t, a.stateDir, "grabber", false, []*discoveryv1.Device{
		{Id: "serial", DeviceSpecs: []*discoveryv1.DeviceSpec{{HostPath: "/dev/ttyUSB7", ContainerPath: "/dev/ttyUSB0", Permissions: "rw"}}},
		{Id: "root", Mounts: []*discoveryv1.Mount{{HostPath: "/", ContainerPath: "/host"}}},
		{Id: "shadow", DeviceSpecs: []*discoveryv1.DeviceSpec{{HostPath: "/dev/../etc/shadow", ContainerPath: "/dev/x", Permissions: "r"}}},
		{Id: "link-key", Mounts: []*discoveryv1.Mount{{HostPath: a.stateDir + "/link", ContainerPath: "/creds", ReadOnly: true}}},
	})
	createConfiguration(t, ns, "grab", "grabber", `{}`)
	testwait.For(t, 15*time.Second, func() error {
		got := listInstances(t, ns, "grab")
		if len(got) != 1 || got[0].DeviceID != "serial" {
			return fmt.Errorf("instances %v, want the serial port's alone", got)
		}
		st := nodeStatus(t, ns, "grab", "node-a")
		if st == nil {
			return errPending
		}
		c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionDiscovering)
		if c == nil {
			return errPending
		}
		for _, w := range []string{"3 invalid devices", `device "root"`, `device "shadow"`, `device "link-key"`, "--allowed-mount-paths", "--allowed-device-paths"} {
			if !strings.Contains(c.Message, w) {
				return fmt.Errorf("condition message %q lacks %q", c.Message, w)
			}
		}
		return nil
	})
}
