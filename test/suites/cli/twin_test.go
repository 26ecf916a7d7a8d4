package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/dowsectl"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/procs"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// testSetWait: `twin set --wait` returns once the mapper has written the
// value to the peer's register, and fails with the mapper's own words when
// the device refuses it (an input register the model calls writable); the
// Device's Differing column counts the refused one.
func testSetWait(t *testing.T, r *rig) {
	dev := r.plcDevice(t)
	start := time.Now()
	out, err := r.plugin("twin", "set", dev.Name, "setpoint", "12", "--wait=60s")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("twin set --wait returned after %s: %s", time.Since(start).Round(time.Millisecond), strings.TrimSpace(out))
	if !strings.Contains(out, "setpoint=12 applied") {
		t.Errorf("twin set --wait printed %q", out)
	}
	// Applied means on the device: the register holds it already.
	if got := r.holding(t, 0); got != "12" {
		t.Errorf("register 0 reads %s right after set --wait returned, want 12", got)
	}

	_, errOut, err := r.kubectlRun("dowse", "-n", ns, "twin", "set", dev.Name, "limit", "9", "--wait=60s")
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(errOut, "refused by the mapper") || !strings.Contains(errOut, `desired value "9"`) ||
		!strings.Contains(errOut, "cannot be written") {
		t.Errorf("twin set limit 9 --wait: %v, stderr %q; want exit 1 with the mapper's refusal", err, errOut)
	}
	testwait.For(t, 30*time.Second, func() error {
		return checkTable(r, []string{"get", "devices"}, []string{"NAME", "MODEL", "NODE", "STATE", "DIFFERING", "LAST REPORT", "AGE"},
			dev.Name, map[string]string{"DIFFERING": "1"})
	})
	out, err = r.plugin("describe", "device", dev.Name)
	if err != nil || !strings.Contains(out, "7 *") || !strings.Contains(out, "cannot be written") || !strings.Contains(out, "MapperError") {
		t.Errorf("describe device after the refusal: %v\n%s", err, out)
	}
	// The model's own check refuses before anything is written.
	_, errOut, err = r.kubectlRun("dowse", "-n", ns, "twin", "set", dev.Name, "setpoint", "99", "--wait")
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(errOut, "above the maximum 30") {
		t.Errorf("twin set setpoint 99: %v %q, want the model's maximum", err, errOut)
	}
	// Back to a clean twin for the console.
	clearDesired(t, r, dev.Name, "limit")
	testwait.For(t, 30*time.Second, func() error {
		return checkTable(r, []string{"get", "devices"}, []string{"NAME", "MODEL", "NODE", "STATE", "DIFFERING", "LAST REPORT", "AGE"},
			dev.Name, map[string]string{"DIFFERING": "0"})
	})
}

// clearDesired removes a property's desired value, as a person editing the
// Device would.
func clearDesired(t *testing.T, r *rig, device, prop string) {
	t.Helper()
	var d v1alpha1.Device
	if err := r.client.Get(context.Background(), client.ObjectKey{Namespace: ns, Name: device}, &d); err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(d.Spec.Properties, func(p v1alpha1.DeviceProperty) bool { return p.Name == prop })
	if i < 0 || d.Spec.Properties[i].Desired == nil {
		return
	}
	patch := fmt.Sprintf(`[{"op":"test","path":"/spec/properties/%d/name","value":%q},{"op":"remove","path":"/spec/properties/%d/desired"}]`, i, prop, i)
	if err := r.client.Patch(context.Background(), &d, client.RawPatch(types.JSONPatchType, []byte(patch))); err != nil {
		t.Fatal(err)
	}
}

// testWatchAcrossRestart: while the API server is down, `twin watch -o
// json` and the console say it is unreachable; once it is back both go on
// by themselves, and changes made after are printed and shown.
func testWatchAcrossRestart(t *testing.T, r *rig) {
	dev := r.plcDevice(t)
	out := procs.NewLines()
	w, err := procs.Start("dowsectl", out, "twin", "watch", dev.Name, "-o", "json", "--kubeconfig", r.kubeconfig, "-n", ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	seen := func(field, value string) error {
		for _, l := range out.All() {
			var ch dowsectl.Change
			if json.Unmarshal([]byte(l), &ch) != nil {
				continue // the outage's report (stderr shares the stream)
			}
			if ch.Device == dev.Name && ch.Property == "setpoint" && ch.Field == field && ch.Value == value {
				return nil
			}
		}
		return fmt.Errorf("twin watch printed no setpoint %s=%s:\n%s", field, value, out.String())
	}
	set := func(v string) {
		t.Helper()
		if out, err := r.plugin("twin", "set", dev.Name, "setpoint", v); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	set("14")
	testwait.For(t, 30*time.Second, func() error { return seen("reported", "14") })

	page := openConsole(t, r, nil)
	page.waitText(t, `[data-device="plant/`+dev.Name+`"] [data-property="setpoint"] td.reported`, "14")

	start := time.Now()
	if err := r.cp.StopAPIServer(); err != nil {
		t.Fatal(err)
	}
	t.Logf("API server stopped in %s", time.Since(start).Round(time.Millisecond))
	// Down until both noticed (a blip shorter than their retry would go
	// unseen, rightly), then back.
	testwait.For(t, 90*time.Second, func() error {
		if out.Count("API server unreachable") == 0 {
			return fmt.Errorf("twin watch has not reported the outage:\n%s", out.String())
		}
		if got := page.problems(); !strings.Contains(got, "API server unreachable") {
			return fmt.Errorf("the console shows %q, want the API server unreachable", got)
		}
		return nil
	})
	page.screenshot(t, "api-server-down")
	if w.Exited() {
		t.Fatalf("twin watch ended with the API server:\n%s", out.String())
	}
	if err := r.cp.StartAPIServer(); err != nil {
		t.Fatal(err)
	}
	t.Logf("API server down for %s in all", time.Since(start).Round(time.Millisecond))
	set("16")
	testwait.For(t, 60*time.Second, func() error {
		if err := seen("desired", "16"); err != nil {
			return err
		}
		return seen("reported", "16")
	})
	if out.Count("watching again") == 0 {
		t.Errorf("twin watch did not say it watches again:\n%s", out)
	}
	page.waitText(t, `[data-device="plant/`+dev.Name+`"] [data-property="setpoint"] td.reported`, "16")
	page.waitNoProblems(t)
	page.screenshot(t, "after-restart")
}
