package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/dowsectl"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/testwait"
	"github.com/dowse-dev/dowse/test/peers/npmpeer"
)

// table reads a printed table: its header's column names and each row's
// cells by column name (columns are at least two spaces apart).
type table struct {
	header []string
	rows   []map[string]string
}

var headerCell = regexp.MustCompile(`\S+( \S+)*`)

// parseTable cuts each row at the header's column starts, so an empty
// cell stays empty.
func parseTable(out string) table {
	var t table
	var starts []int
	for _, line := range strings.Split(strings.TrimRight(out, "\n"), "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		if t.header == nil {
			for _, loc := range headerCell.FindAllStringIndex(line, -1) {
				t.header = append(t.header, line[loc[0]:loc[1]])
				starts = append(starts, loc[0])
			}
			continue
		}
		row := map[string]string{}
		for i, h := range t.header {
			from, to := starts[i], len(line)
			if i+1 < len(starts) {
				to = min(starts[i+1], len(line))
			}
			if from < len(line) {
				row[h] = strings.TrimSpace(line[from:to])
			}
		}
		t.rows = append(t.rows, row)
	}
	return t
}

func (t table) row(name string) map[string]string {
	for _, r := range t.rows {
		if r["NAME"] == name {
			return r
		}
	}
	return nil
}

// checkTable runs a get and checks its header and that row name has want.
func checkTable(r *rig, args []string, header []string, name string, want map[string]string) error {
	out, err := r.plugin(args...)
	if err != nil {
		return err
	}
	tb := parseTable(out)
	if !slices.Equal(tb.header, header) {
		return fmt.Errorf("%v: header %q, want %q\n%s", args, tb.header, header, out)
	}
	row := tb.row(name)
	if row == nil {
		return fmt.Errorf("%v: no row %s\n%s", args, name, out)
	}
	for k, v := range want {
		if row[k] != v {
			return fmt.Errorf("%v: %s %s is %q, want %q\n%s", args, name, k, row[k], v, out)
		}
	}
	return nil
}

// checkFormats checks -o json, yaml, name and jsonpath of a get: the same
// objects, of kind, named names.
func checkFormats(t *testing.T, r *rig, resource, kind string, names []string) {
	t.Helper()
	for _, format := range []string{"json", "yaml"} {
		out, err := r.plugin("get", resource, "-o", format)
		if err != nil {
			t.Fatal(err)
		}
		var list struct {
			Kind  string `json:"kind"`
			Items []struct {
				Kind     string `json:"kind"`
				Metadata struct{ Name, Namespace string }
			} `json:"items"`
		}
		if err := yaml.Unmarshal([]byte(out), &list); err != nil {
			t.Fatalf("get %s -o %s: %v\n%s", resource, format, err, out)
		}
		var got []string
		for _, it := range list.Items {
			if it.Kind != kind || it.Metadata.Namespace != ns {
				t.Errorf("get %s -o %s: item %s of kind %s in %s, want %s in %s", resource, format, it.Metadata.Name, it.Kind, it.Metadata.Namespace, kind, ns)
			}
			got = append(got, it.Metadata.Name)
		}
		slices.Sort(got)
		if list.Kind != "List" || !slices.Equal(got, names) {
			t.Errorf("get %s -o %s: %s of %v, want a List of %v", resource, format, list.Kind, got, names)
		}
	}
	// One object by name prints as itself.
	out, err := r.plugin("get", resource, names[0], "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var one struct {
		Kind     string
		Metadata struct{ Name string }
	}
	if err := json.Unmarshal([]byte(out), &one); err != nil || one.Kind != kind || one.Metadata.Name != names[0] {
		t.Errorf("get %s %s -o json: %v %+v, want the %s itself", resource, names[0], err, one, kind)
	}
	out, err = r.plugin("get", resource, "-o", "name")
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, n := range names {
		want = append(want, strings.ToLower(kind)+".dowse.dev/"+n)
	}
	if got := strings.Fields(out); !slices.Equal(got, want) {
		t.Errorf("get %s -o name: %q, want %q", resource, got, want)
	}
	out, err = r.plugin("get", resource, "-o", "jsonpath={.items[*].metadata.name}")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(out); !slices.Equal(got, names) {
		t.Errorf("get %s -o jsonpath: %q, want %q", resource, got, names)
	}
}

func instanceOf(t *testing.T, r *rig, cfg string) *v1alpha1.Instance {
	t.Helper()
	var inst *v1alpha1.Instance
	testwait.For(t, 60*time.Second, func() error {
		var list v1alpha1.InstanceList
		if err := r.client.List(context.Background(), &list, client.InNamespace(ns)); err != nil {
			return err
		}
		for i := range list.Items {
			if list.Items[i].Spec.ConfigurationName == cfg {
				inst = &list.Items[i]
				return nil
			}
		}
		return fmt.Errorf("no Instance of %s yet", cfg)
	})
	return inst
}

func testPlugin(t *testing.T, r *rig) {
	ctx := context.Background()
	echo := instanceOf(t, r, "debug-echo")
	plc := instanceOf(t, r, "plc")
	dev := r.plcDevice(t)
	instances := []string{echo.Name, plc.Name}
	slices.Sort(instances)

	// Printer columns, computed by the API server from the CRDs; the counts
	// behind them are written by the controller.
	testwait.For(t, 30*time.Second, func() error {
		return checkTable(r, []string{"get", "configurations"}, []string{"NAME", "HANDLER", "CAPACITY", "SEEING", "READY", "INSTANCES", "BROKERS", "AGE"},
			"debug-echo", map[string]string{"HANDLER": "debug-echo", "CAPACITY": "2", "SEEING": "1", "READY": "1", "INSTANCES": "1", "BROKERS": "0"})
	})
	if err := checkTable(r, []string{"get", "dcfg", "-o", "wide"}, []string{"NAME", "HANDLER", "CAPACITY", "ALLOCATION", "SEEING", "READY", "INSTANCES", "BROKERS", "AGE"},
		"plc", map[string]string{"HANDLER": "modbus", "ALLOCATION": "DevicePlugin", "SEEING": "1", "READY": "1"}); err != nil {
		t.Error(err)
	}
	checkFormats(t, r, "configurations", "Configuration", []string{"debug-echo", "plc"})

	// Slots in use: an agent claims one (as its device plugin would), the
	// controller counts it.
	claim := func(slots string) {
		t.Helper()
		patch := fmt.Sprintf(`{"status":{"slots":%s}}`, slots)
		if err := r.client.Patch(ctx, echo.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(patch))); err != nil {
			t.Fatal(err)
		}
	}
	claim(fmt.Sprintf(`[{"id":"%s-0","node":"edge-1","resource":"dowse.dev/%s"}]`, echo.Name, echo.Name))
	testwait.For(t, 30*time.Second, func() error {
		return checkTable(r, []string{"get", "instances"}, []string{"NAME", "CONFIGURATION", "SHARED", "NODES", "IN USE", "CAPACITY", "AGE"},
			echo.Name, map[string]string{"CONFIGURATION": "debug-echo", "SHARED": "false", "NODES": "edge-1", "IN USE": "1", "CAPACITY": "2"})
	})
	out, err := r.plugin("describe", "instance", echo.Name)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Configuration:  debug-echo", "GREETING", "hello", "Slots (1 of 2 in use)", echo.Name + "-0", "edge-1", "Device:         <none>", "Events:"} {
		if !strings.Contains(out, want) {
			t.Errorf("describe instance lacks %q:\n%s", want, out)
		}
	}
	claim("null")
	testwait.For(t, 30*time.Second, func() error {
		return checkTable(r, []string{"get", "instances", "-o", "wide"}, []string{"NAME", "CONFIGURATION", "SHARED", "NODES", "IN USE", "CAPACITY", "DEVICE ID", "AGE"},
			echo.Name, map[string]string{"IN USE": "0", "DEVICE ID": echo.Spec.DeviceID})
	})
	checkFormats(t, r, "instances", "Instance", instances)

	if err := checkTable(r, []string{"get", "devices"}, []string{"NAME", "MODEL", "NODE", "STATE", "DIFFERING", "LAST REPORT", "AGE"},
		dev.Name, map[string]string{"MODEL": "thermostat", "NODE": "edge-1", "STATE": "ok", "DIFFERING": "0"}); err != nil {
		t.Error(err)
	}
	if err := checkTable(r, []string{"get", "ddev", "-o", "wide"}, []string{"NAME", "MODEL", "NODE", "STATE", "DIFFERING", "APPLIED", "MAPPER", "LAST REPORT", "AGE"},
		dev.Name, map[string]string{"APPLIED": "", "MAPPER": "plc"}); err != nil {
		t.Error(err)
	}
	checkFormats(t, r, "devices", "Device", []string{dev.Name})
	if err := checkTable(r, []string{"get", "devicemodels", "-o", "wide"}, []string{"NAME", "PROTOCOL", "AGE"},
		"thermostat", map[string]string{"PROTOCOL": "modbus"}); err != nil {
		t.Error(err)
	}
	checkFormats(t, r, "devicemodels", "DeviceModel", []string{"thermostat"})

	// Every kind at once, the plugin's and kubectl's own (the CRDs'
	// dowse category).
	out, err = r.plugin("get", "dowse")
	if err != nil {
		t.Fatal(err)
	}
	kout, kerr, err := r.kubectlRun("get", "dowse", "-n", ns)
	if err != nil {
		t.Fatalf("kubectl get dowse: %v: %s", err, kerr)
	}
	for _, want := range []string{"configuration.dowse.dev/debug-echo", "configuration.dowse.dev/plc", "instance.dowse.dev/" + echo.Name,
		"devicemodel.dowse.dev/thermostat", "device.dowse.dev/" + dev.Name} {
		if !strings.Contains(out, want) {
			t.Errorf("kubectl dowse get dowse lacks %q:\n%s", want, out)
		}
		if !strings.Contains(kout, want) {
			t.Errorf("kubectl get dowse (the category) lacks %q:\n%s", want, kout)
		}
	}
	out, err = r.plugin("get", "dowse", "-o", "name")
	if err != nil || len(strings.Fields(out)) != 6 {
		t.Errorf("get dowse -o name: %v %q, want the 6 objects", err, out)
	}

	// describe, each kind.
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"describe", "configuration", "debug-echo"}, []string{"Handler:        debug-echo", "Details:", "foo0", "Nodes:", "edge-1", "Instances:", echo.Name,
			"Brokers:", "Twins:", "Conditions:", "BrokersDeployed", "Events:"}},
		{[]string{"describe", "dcfg/plc"}, []string{"Device template: model thermostat", "Twins:", dev.Name, "ok", "Skipped (looked at, not reported as devices):", "NoReply", r.closedAddr}},
		{[]string{"describe", "device", dev.Name}, []string{"Model:          thermostat", "Node:           edge-1", "Protocol:       modbus", "Mapper:         plc",
			"MapperConnected", "State:          ok", "setpoint", "temperature", "21.5", "limit", "Conditions:", "Events:"}},
		{[]string{"describe", "devicemodel", "thermostat"}, []string{"Protocol:       modbus", "setpoint", "ReadWrite", "30", "Devices:", dev.Name}},
	} {
		out, err := r.plugin(tc.args...)
		if err != nil {
			t.Error(err)
			continue
		}
		for _, want := range tc.want {
			if !strings.Contains(out, want) {
				t.Errorf("%v lacks %q:\n%s", tc.args, want, out)
			}
		}
	}

	// twin get, every format.
	out, err = r.plugin("twin", "get", dev.Name)
	if err != nil {
		t.Fatal(err)
	}
	tb := parseTable(strings.SplitN(out, "\n", 2)[1])
	if !strings.HasPrefix(out, "Device plant/"+dev.Name+"  model thermostat  node edge-1  state ok") ||
		!slices.Equal(tb.header, []string{"PROPERTY", "DESIRED", "REPORTED", "REPORTED AGE", "OBSERVED DESIRED", "OBSERVED AGE"}) || len(tb.rows) != 3 {
		t.Errorf("twin get:\n%s", out)
	}
	out, err = r.plugin("twin", "get", dev.Name, "-o", "wide")
	if err != nil || !strings.Contains(out, "DESIRED ERROR") {
		t.Errorf("twin get -o wide: %v\n%s", err, out)
	}
	for _, format := range []string{"json", "yaml"} {
		out, err := r.plugin("twin", "get", dev.Name, "-o", format)
		if err != nil {
			t.Fatal(err)
		}
		var tw dowsectl.Twin
		if err := yaml.Unmarshal([]byte(out), &tw); err != nil {
			t.Fatalf("twin get -o %s: %v\n%s", format, err, out)
		}
		i := slices.IndexFunc(tw.Properties, func(p dowsectl.TwinPropValue) bool { return p.Name == "temperature" })
		if tw.Device != dev.Name || tw.Model != "thermostat" || i < 0 || tw.Properties[i].Reported != "21.5" || tw.Properties[i].ReportedAt == nil {
			t.Errorf("twin get -o %s: %+v, want temperature 21.5 with its read time", format, tw)
		}
	}
	if out, err := r.plugin("twin", "get", dev.Name, "-o", "name"); err != nil || strings.TrimSpace(out) != "device.dowse.dev/"+dev.Name {
		t.Errorf("twin get -o name: %v %q", err, out)
	}

	// token and ca-hash, in the controller's namespace.
	pin, err := r.plugin("ca-hash", "-n", "dowse-system")
	if err != nil || !strings.HasPrefix(pin, "sha256:") {
		t.Fatalf("ca-hash: %v %q", err, pin)
	}
	pin = strings.TrimSpace(pin)
	out, err = r.plugin("ca-hash", "-n", "dowse-system", "-o", "json")
	var hash struct{ CACertHash string }
	if err != nil || json.Unmarshal([]byte(out), &hash) != nil || hash.CACertHash != pin {
		t.Errorf("ca-hash -o json: %v %q, want %s", err, out, pin)
	}
	if out, err = r.plugin("token", "create", "--node", "edge-2", "-n", "dowse-system"); err != nil || !strings.Contains(out, "--link-ca-cert-hash="+pin) {
		t.Errorf("token create: %v\n%s", err, out)
	}
	out, err = r.plugin("token", "list", "-n", "dowse-system")
	if tb := parseTable(out); err != nil || !slices.Equal(tb.header, []string{"ID", "NODE", "EXPIRES", "USED"}) || len(tb.rows) != 2 {
		t.Errorf("token list (edge-1's used, edge-2's not): %v\n%s", err, out)
	}
	out, err = r.plugin("token", "list", "-n", "dowse-system", "-o", "yaml")
	var toks struct{ Tokens []struct{ Node string } }
	if err != nil || yaml.Unmarshal([]byte(out), &toks) != nil || len(toks.Tokens) != 2 {
		t.Errorf("token list -o yaml: %v\n%s", err, out)
	}
	if out, err = r.plugin("token", "list", "-n", "dowse-system", "-o", "name"); err != nil || len(strings.Fields(out)) != 2 || !strings.HasPrefix(out, "token/") {
		t.Errorf("token list -o name: %v %q", err, out)
	}

	// Bad input: what is wrong, and the usage exit code 2.
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"get", "gadgets"}, 2, `"gadgets" is not a Dowse resource type`},
		{[]string{"get", "devices", "-o", "xml"}, 2, "unable to match a printer"},
		{[]string{"get", "devices", "nope"}, 1, `devices.dowse.dev "nope" not found`},
		{[]string{"twin", "set", dev.Name, "setpoint"}, 2, "needs DEVICE PROPERTY VALUE"},
		{[]string{"twin", "set", dev.Name, "temperature", "3"}, 1, "ReadOnly"},
		{[]string{"token", "create", "-n", "dowse-system"}, 2, "--node is required"},
	} {
		_, errOut, err := r.kubectlRun(append([]string{"dowse", "-n", ns}, tc.args...)...)
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("kubectl dowse %v: %v, stderr %q; want exit %d saying %q", tc.args, err, errOut, tc.code, tc.want)
		}
	}
	// Help speaks of the plugin as the user called it.
	if out, err := r.plugin("--help"); err != nil || !strings.Contains(out, "kubectl dowse [command]") {
		t.Errorf("kubectl dowse --help: %v\n%s", err, out)
	}
}

func testCompletion(t *testing.T, r *rig) {
	dev := r.plcDevice(t)
	dir := t.TempDir()
	for _, shell := range []string{"bash", "zsh", "fish"} {
		out, err := r.plugin("completion", shell)
		if err != nil || !strings.Contains(out, "__complete") {
			t.Fatalf("completion %s: %v\n%.300s", shell, err, out)
		}
		if err := os.WriteFile(filepath.Join(dir, shell), []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// The bash script loads, registers itself, and completes a Device's
	// name from the API server and a ReadWrite property of its model. It
	// is generated for dowsectl (the link on PATH), as a user installs it.
	out, err := exec.Command(filepath.Join(r.pathDir, "dowsectl"), "completion", "bash").Output()
	if err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(dir, "dowsectl.bash")
	if err := os.WriteFile(script, out, 0o644); err != nil {
		t.Fatal(err)
	}
	// Cobra's script uses bash-completion's helpers, which a Debian user's
	// interactive bash has loaded.
	const bashCompletion = "/usr/share/bash-completion/bash_completion"
	if _, err := os.Stat(bashCompletion); err != nil {
		npmpeer.Unavailable(t, "%s is missing: run hack/install-deps.sh (Debian bash-completion)", bashCompletion)
	}
	complete := func(line string) string {
		t.Helper()
		words := strings.Fields(line)
		if strings.HasSuffix(line, " ") {
			words = append(words, "")
		}
		var quoted []string
		for _, w := range words {
			quoted = append(quoted, fmt.Sprintf("%q", w))
		}
		prog := fmt.Sprintf(`source %q || exit 2
source %q || exit 3
complete -p dowsectl >/dev/null || exit 4
COMP_WORDS=(%s); COMP_CWORD=%d; COMP_LINE=%q; COMP_POINT=${#COMP_LINE}
__start_dowsectl dowsectl
printf '%%s\n' "${COMPREPLY[@]}"`, bashCompletion, script, strings.Join(quoted, " "), len(words)-1, line)
		cmd := exec.Command("bash", "--norc", "--noprofile", "-c", prog)
		cmd.Env = r.env()
		// stderr has compopt's complaint that this is no real completion.
		var errOut strings.Builder
		cmd.Stderr = &errOut
		b, err := cmd.Output()
		if err != nil {
			t.Fatalf("bash completion of %q: %v\n%s%s", line, err, b, errOut.String())
		}
		return string(b)
	}
	if got := complete("dowsectl get dev"); !strings.Contains(got, "devices") {
		t.Errorf("completing `get dev`: %q, want devices", got)
	}
	if got := complete("dowsectl -n " + ns + " get devices "); strings.TrimSpace(got) != dev.Name {
		t.Errorf("completing a Device's name: %q, want %s", got, dev.Name)
	}
	if got := strings.Fields(complete("dowsectl -n " + ns + " twin set " + dev.Name + " ")); !slices.Equal(got, []string{"setpoint", "limit"}) {
		t.Errorf("completing a property to set: %q, want the ReadWrite ones", got)
	}
	// kubectl completes the plugin through kubectl_complete-dowse.
	kout, kerr, err := r.kubectlRun("__complete", "dowse", "-n", ns, "describe", "devicemodels", "")
	if err != nil || !strings.Contains(kout, "thermostat") {
		t.Errorf("kubectl __complete dowse describe devicemodels: %v %q %s", err, kout, kerr)
	}
}
