package dowsectl

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/dowsectl/live"
	readingsv1 "github.com/dowse-dev/dowse/shared/api/readings/v1alpha1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	acv1alpha1 "github.com/dowse-dev/dowse/shared/api/v1alpha1/applyconfiguration/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// TwinFieldManager is the field manager of `dowsectl twin set`: the desired
// value it sets is then its own, and the controller's template defaults
// never write over it.
const TwinFieldManager = "dowsectl"

// DefaultWait is how long `twin set --wait` waits when given no duration.
const DefaultWait = time.Minute

var devices = resources[3]

func newTwinCommand(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "twin",
		Short: "A Device's twin: desired and reported values",
		Args:  noArgs,
		RunE:  func(cmd *cobra.Command, _ []string) error { return cmd.Help() },
	}
	cmd.AddCommand(newTwinGetCommand(c), newTwinSetCommand(c), newTwinWatchCommand(c))
	return cmd
}

func newTwinGetCommand(c *cli) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:               "get DEVICE",
		Short:             "Desired, reported and observed desired values, with their age",
		Example:           "  dowsectl twin get boiler-1\n  dowsectl twin get boiler-1 -o json",
		Args:              exactArgs(1, "a Device name"),
		ValidArgsFunction: c.completeNames(devices),
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, key, err := c.deviceKey(args[0])
			if err != nil {
				return err
			}
			var d v1alpha1.Device
			if err := cl.Get(cmd.Context(), key, &d); err != nil {
				return err
			}
			now := time.Now()
			switch output {
			case "":
				return PrintTwin(c.streams.Out, &d, now)
			case "wide":
				return printTwinTable(c.streams.Out, &d, now, true)
			case "name":
				_, err := fmt.Fprintln(c.streams.Out, "device.dowse.dev/"+d.Name)
				return err
			case "json", "yaml":
				return printResult(c.streams.Out, output, TwinOf(&d))
			}
			return usageErrorf("-o must be wide, json, yaml or name, not %q", output)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "wide, json, yaml or name (default: a table)")
	return cmd
}

func newTwinSetCommand(c *cli) *cobra.Command {
	var wait time.Duration
	cmd := &cobra.Command{
		Use:   "set DEVICE PROPERTY VALUE",
		Short: "Set a desired value, checked against the DeviceModel first",
		Long: `Set PROPERTY's desired value on DEVICE, after checking it against the
DeviceModel (the property exists, is ReadWrite, VALUE parses as its type and
lies within minimum and maximum). With --wait, wait until the mapper has
applied it (the value comes back as observedDesired) or fail with the
mapper's error.`,
		Example:           "  dowsectl twin set boiler-1 setpoint 22\n  dowsectl twin set boiler-1 setpoint 22 --wait\n  dowsectl twin set boiler-1 setpoint 22 --wait=10s",
		Args:              exactArgs(3, "DEVICE PROPERTY VALUE"),
		ValidArgsFunction: c.completeTwinSet,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, key, err := c.deviceKey(args[0])
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if err := SetDesired(ctx, cl, key, args[1], args[2]); err != nil {
				return err
			}
			if wait <= 0 {
				_, err := fmt.Fprintf(c.streams.Out, "device.dowse.dev/%s desired %s=%s\n", key.Name, args[1], args[2])
				return err
			}
			// The generation of the spec that holds the value: an older
			// status cannot say it was applied.
			var d v1alpha1.Device
			if err := cl.Get(ctx, key, &d); err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(ctx, wait)
			defer cancel()
			res, err := c.waitApplied(ctx, key, args[1], args[2], d.Generation)
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(c.streams.Out, "device.dowse.dev/%s %s=%s applied (reported %s)\n", key.Name, args[1], args[2], orDash(res))
			return err
		},
	}
	cmd.Flags().DurationVar(&wait, "wait", 0, "wait this long (--wait alone: "+DefaultWait.String()+") for the mapper to apply the value, failing with its error")
	cmd.Flags().Lookup("wait").NoOptDefVal = DefaultWait.String()
	return cmd
}

func newTwinWatchCommand(c *cli) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "watch DEVICE",
		Short: "Print each change of the twin as it lands (survives API server restarts)",
		Long: `Print one line per change of a desired, reported or observed desired value
or of the device's state, as it lands. A watch the API server ends or lets
expire is started again, and an unreachable API server retried, until
Ctrl-C; the outage is reported on stderr. -o json prints one JSON object a
line, for scripts. Reported values and the state come live from the
controller's readings API (readings.dowse.dev, kubectl get devicereadings)
when the API server serves it, ahead of Device.status, which is written
under a budget; otherwise from Device.status.`,
		Args:              exactArgs(1, "a Device name"),
		ValidArgsFunction: c.completeNames(devices),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "" && output != "json" {
				return usageErrorf("-o must be json (default: text lines), not %q", output)
			}
			_, key, err := c.deviceKey(args[0])
			if err != nil {
				return err
			}
			dyn, err := c.dynamic()
			if err != nil {
				return err
			}
			cfg, err := c.config()
			if err != nil {
				return err
			}
			served := false
			if dc, err := discovery.NewDiscoveryClientForConfig(cfg); err == nil {
				served = live.ReadingsServed(dc)
			}
			if !served {
				fmt.Fprintf(c.streams.ErrOut, "the live readings API (%s) is not served: reported values as Device.status holds them\n", readingsv1.APIServiceName)
			}
			return watchTwin(cmd.Context(), dyn, key, c.streams.Out, c.streams.ErrOut, output == "json", served)
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "json: one JSON object per change (default: text lines)")
	return cmd
}

// deviceKey is the client and the key of the Device name in the
// command's namespace.
func (c *cli) deviceKey(name string) (client.WithWatch, client.ObjectKey, error) {
	ns, err := c.namespace()
	if err != nil {
		return nil, client.ObjectKey{}, err
	}
	cl, err := c.client()
	if err != nil {
		return nil, client.ObjectKey{}, err
	}
	return cl, client.ObjectKey{Namespace: ns, Name: name}, nil
}

// completeTwinSet completes the Device, then its ReadWrite properties.
func (c *cli) completeTwinSet(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	switch len(args) {
	case 0:
		return c.listNames(cmd.Context(), devices, toComplete), cobra.ShellCompDirectiveNoFileComp
	case 1:
		cl, key, err := c.deviceKey(args[0])
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), completionTimeout)
		defer cancel()
		var d v1alpha1.Device
		var m v1alpha1.DeviceModel
		if cl.Get(ctx, key, &d) != nil || d.Spec.DeviceModelRef == nil ||
			cl.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: d.Spec.DeviceModelRef.Name}, &m) != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []string
		for _, p := range m.Spec.Properties {
			if p.AccessMode == v1alpha1.ReadWrite && strings.HasPrefix(p.Name, toComplete) {
				out = append(out, p.Name)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
	return nil, cobra.ShellCompDirectiveNoFileComp
}

// PrintTwin writes the Device's twin as a table.
func PrintTwin(w io.Writer, d *v1alpha1.Device, now time.Time) error {
	return printTwinTable(w, d, now, false)
}

func printTwinTable(w io.Writer, d *v1alpha1.Device, now time.Time, wide bool) error {
	model := ""
	if d.Spec.DeviceModelRef != nil {
		model = d.Spec.DeviceModelRef.Name
	}
	fmt.Fprintf(w, "Device %s/%s  model %s  node %s  state %s  last report %s\n", d.Namespace, d.Name,
		orDash(model), orDash(d.Spec.NodeName), orDash(d.Status.State), ageOfTime(d.Status.LastReportTime, now))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	header := "PROPERTY\tDESIRED\tREPORTED\tREPORTED AGE\tOBSERVED DESIRED\tOBSERVED AGE"
	if wide {
		header += "\tERROR\tDESIRED ERROR"
	}
	fmt.Fprintln(tw, header)
	for _, p := range TwinOf(d).Properties {
		line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s", p.Name, orDash(p.Desired), orDash(p.Reported), age(p.ReportedAt, now),
			orDash(p.ObservedDesired), age(p.ObservedAt, now))
		if wide {
			line += fmt.Sprintf("\t%s\t%s", orDash(p.Error), orDash(p.DesiredError))
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}

// Twin is a Device's twin as `twin get -o json` prints it.
type Twin struct {
	Namespace  string          `json:"namespace"`
	Device     string          `json:"device"`
	Model      string          `json:"model,omitempty"`
	Node       string          `json:"node,omitempty"`
	State      string          `json:"state,omitempty"`
	LastReport *metav1.Time    `json:"lastReport,omitempty"`
	Properties []TwinPropValue `json:"properties"`
}

// TwinPropValue is one property's values; times are when the mapper read
// or applied them.
type TwinPropValue struct {
	Name            string     `json:"name"`
	Desired         string     `json:"desired,omitempty"`
	Reported        string     `json:"reported,omitempty"`
	ReportedAt      *time.Time `json:"reportedAt,omitempty"`
	ObservedDesired string     `json:"observedDesired,omitempty"`
	ObservedAt      *time.Time `json:"observedAt,omitempty"`
	// Error is the last read's failure (Reported is then the last good
	// value), DesiredError the last desired value's.
	Error        string `json:"error,omitempty"`
	DesiredError string `json:"desiredError,omitempty"`
}

// TwinOf reads d's twin: the spec's properties in order, then any the
// status alone has.
func TwinOf(d *v1alpha1.Device) Twin {
	t := Twin{Namespace: d.Namespace, Device: d.Name, Node: d.Spec.NodeName, State: d.Status.State, LastReport: d.Status.LastReportTime, Properties: []TwinPropValue{}}
	if d.Spec.DeviceModelRef != nil {
		t.Model = d.Spec.DeviceModelRef.Name
	}
	var names []string
	for _, p := range d.Spec.Properties {
		names = append(names, p.Name)
	}
	for _, tw := range d.Status.Twins {
		if !slices.Contains(names, tw.PropertyName) {
			names = append(names, tw.PropertyName)
		}
	}
	for _, name := range names {
		v := TwinPropValue{Name: name}
		if p := d.Property(name); p != nil && p.Desired != nil {
			v.Desired = p.Desired.Value
		}
		if tw := d.Twin(name); tw != nil {
			if tw.Reported != nil {
				v.Reported, v.ReportedAt = tw.Reported.Value, timestamp(tw.Reported.Metadata)
				v.Error, v.DesiredError = tw.Reported.Metadata[twinvalue.MetaError], tw.Reported.Metadata[twinvalue.MetaDesiredError]
			}
			if tw.ObservedDesired != nil {
				v.ObservedDesired, v.ObservedAt = tw.ObservedDesired.Value, timestamp(tw.ObservedDesired.Metadata)
			}
		}
		t.Properties = append(t.Properties, v)
	}
	return t
}

// timestamp reads a twin value's timestamp metadata.
func timestamp(md map[string]string) *time.Time {
	t, ok := twinvalue.TimestampOf(md)
	if !ok {
		return nil
	}
	t = t.UTC()
	return &t
}

func age(t *time.Time, now time.Time) string {
	if t == nil {
		return "-"
	}
	return now.Sub(*t).Round(100 * time.Millisecond).String()
}

func ageOfTime(t *metav1.Time, now time.Time) string {
	if t == nil || t.IsZero() {
		return "-"
	}
	return now.Sub(t.Time).Round(100*time.Millisecond).String() + " ago"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// SetDesired sets property's desired value on the Device after checking it
// against the DeviceModel (property known, ReadWrite, of its type, within
// minimum and maximum), as server-side apply under TwinFieldManager. The
// console's form calls it too, so both refuse alike.
func SetDesired(ctx context.Context, c client.Client, key client.ObjectKey, property, value string) error {
	var d v1alpha1.Device
	if err := c.Get(ctx, key, &d); err != nil {
		return err
	}
	if d.Spec.DeviceModelRef == nil {
		return fmt.Errorf("device %s names no DeviceModel", key.Name)
	}
	var m v1alpha1.DeviceModel
	if err := c.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: d.Spec.DeviceModelRef.Name}, &m); err != nil {
		return fmt.Errorf("DeviceModel of %s: %w", key.Name, err)
	}
	mp := m.Property(property)
	if mp == nil {
		return fmt.Errorf("DeviceModel %s has no property %s", m.Name, property)
	}
	if err := mp.CheckDesired(value); err != nil {
		return err
	}
	ac := acv1alpha1.Device(key.Name, key.Namespace).WithSpec(acv1alpha1.DeviceSpec().WithProperties(
		acv1alpha1.DeviceProperty().WithName(property).WithDesired(acv1alpha1.TwinProperty().WithValue(value))))
	return c.Apply(ctx, ac, client.FieldOwner(TwinFieldManager), client.ForceOwnership)
}

// ErrRefused is wrapped by the error of `twin set --wait` when the mapper
// (or the controller) refused the value.
var ErrRefused = errors.New("refused")

// Applied reads whether d shows property's desired value applied (done,
// with the reported value) or refused (err, wrapping ErrRefused), for a
// spec of generation gen or later. Neither means keep waiting.
func Applied(d *v1alpha1.Device, property, value string, gen int64) (done bool, reported string, err error) {
	if c := meta.FindStatusCondition(d.Status.Conditions, v1alpha1.ConditionDeviceValid); c != nil && c.Status == metav1.ConditionFalse && c.ObservedGeneration >= gen {
		return false, "", fmt.Errorf("%w by the controller: %s", ErrRefused, c.Message)
	}
	tw := d.Twin(property)
	if tw == nil {
		return false, "", nil
	}
	if tw.Reported != nil {
		reported = tw.Reported.Value
		// The mapper names the value it refused (`desired value "5000":
		// ...`): an older refusal of another value is not this one's.
		if e := tw.Reported.Metadata[twinvalue.MetaDesiredError]; e != "" && d.Status.ObservedGeneration >= gen &&
			(strings.Contains(e, strconv.Quote(value)) || !strings.HasPrefix(e, "desired value ")) {
			return false, reported, fmt.Errorf("%w by the mapper: %s", ErrRefused, e)
		}
	}
	if tw.ObservedDesired != nil && twinvalue.Equal(tw.ObservedDesired.Value, value) && d.Status.ObservedGeneration >= gen {
		return true, reported, nil
	}
	return false, reported, nil
}

// waitApplied watches the Device until Applied says done or refused, or
// ctx ends.
func (c *cli) waitApplied(ctx context.Context, key client.ObjectKey, property, value string, gen int64) (string, error) {
	dyn, err := c.dynamic()
	if err != nil {
		return "", err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		reported string
		err      error
	}
	done := make(chan result, 1)
	var last *v1alpha1.Device
	var lastErr error
	live.Watch{Client: dyn, Resource: devices.GVR(), Namespace: key.Namespace, FieldSelector: fields.OneTermEqualSelector("metadata.name", key.Name).String()}.Run(ctx, live.Handler{
		Upsert: func(u *unstructured.Unstructured) {
			d, err := deviceOf(u)
			if err != nil {
				return
			}
			last = d
			ok, rep, err := Applied(d, property, value, gen)
			if ok || err != nil {
				done <- result{rep, err}
				cancel()
			}
		},
		Delete: func(*unstructured.Unstructured) {
			done <- result{err: fmt.Errorf("device %s was deleted while waiting", key)}
			cancel()
		},
		State: func(err error) {
			lastErr = err
			if err != nil {
				fmt.Fprintf(c.streams.ErrOut, "%s\n", live.Describe(err, "Devices", key.Namespace))
			}
		},
	})
	select {
	case r := <-done:
		return r.reported, r.err
	default:
	}
	why := "no status yet"
	if last != nil {
		if cond := meta.FindStatusCondition(last.Status.Conditions, v1alpha1.ConditionDesiredApplied); cond != nil {
			why = fmt.Sprintf("DesiredApplied %s %s: %s", cond.Status, cond.Reason, cond.Message)
		}
	}
	if lastErr != nil {
		why = live.Describe(lastErr, "Devices", key.Namespace)
	}
	return "", fmt.Errorf("gave up waiting for the mapper to apply %s=%s on %s (%s)", property, value, key.Name, why)
}

func deviceOf(u *unstructured.Unstructured) (*v1alpha1.Device, error) {
	var d v1alpha1.Device
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// Change is one change of a twin as `twin watch` prints it.
type Change struct {
	Time     time.Time `json:"time"`
	Device   string    `json:"device"`
	Property string    `json:"property,omitempty"`
	// Field is desired, reported, observedDesired, state or deleted.
	Field string `json:"field"`
	Value string `json:"value,omitempty"`
}

func (c Change) String() string {
	switch {
	case c.Field == "deleted":
		return "device deleted"
	case c.Property == "":
		return c.Field + "=" + c.Value
	}
	return c.Property + "." + c.Field + "=" + c.Value
}

// Changes lists what changed in d since last (updated in place): desired,
// reported and observed desired values, and the state.
func Changes(d *v1alpha1.Device, last map[string]string, now time.Time) []Change {
	var out []Change
	note := func(prop, field, v string) {
		k := prop + "." + field
		if old, ok := last[k]; !ok || old != v {
			last[k] = v
			out = append(out, Change{Time: now, Device: d.Name, Property: prop, Field: field, Value: v})
		}
	}
	if d.Status.State != "" {
		note("", "state", d.Status.State)
	}
	for _, p := range d.Spec.Properties {
		if p.Desired != nil {
			note(p.Name, "desired", p.Desired.Value)
		}
	}
	for _, t := range d.Status.Twins {
		if t.Reported != nil {
			note(t.PropertyName, "reported", t.Reported.Value)
		}
		if t.ObservedDesired != nil {
			note(t.PropertyName, "observedDesired", t.ObservedDesired.Value)
		}
	}
	return out
}

// LiveChanges lists what changed in r (a DeviceReading: the newest
// reported values and state, live) since last (updated in place).
func LiveChanges(r *readingsv1.DeviceReading, last map[string]string, now time.Time) []Change {
	var out []Change
	note := func(prop, field, v string) {
		k := prop + "." + field
		if old, ok := last[k]; !ok || old != v {
			last[k] = v
			out = append(out, Change{Time: now, Device: r.Name, Property: prop, Field: field, Value: v})
		}
	}
	if r.State != "" {
		note("", "state", r.State)
	}
	for _, p := range r.Properties {
		note(p.Name, "reported", p.Value)
	}
	return out
}

// watchTwin prints the Device's changes until ctx ends or the Device is
// deleted; connection trouble goes to errOut, and the informers behind it
// list again after a restart or an expired watch. With live, reported
// values and the state come from the live readings API (as the edge
// reports them, ahead of Device.status), the rest from the Device.
func watchTwin(ctx context.Context, dyn dynamic.Interface, key client.ObjectKey, w, errOut io.Writer, asJSON, live bool) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The two watches print through one writer and one memory.
	var mu sync.Mutex
	last := map[string]string{}
	print := func(ch Change) {
		if asJSON {
			b, _ := json.Marshal(ch)
			fmt.Fprintf(w, "%s\n", b)
			return
		}
		fmt.Fprintf(w, "%s %s\n", ch.Time.Format(time.RFC3339Nano), ch)
	}
	if live {
		go watchReadings(ctx, dyn, key, &mu, last, print, errOut)
	}
	watchDevice(ctx, cancel, dyn, key, &mu, last, live, print, errOut)
	return nil
}

// watchReadings prints the changes the live readings API shows of key.
func watchReadings(ctx context.Context, dyn dynamic.Interface, key client.ObjectKey, mu *sync.Mutex, last map[string]string, print func(Change), errOut io.Writer) {
	live.Watch{Client: dyn, Resource: readingsv1.GVR(), Namespace: key.Namespace, FieldSelector: fields.OneTermEqualSelector("metadata.name", key.Name).String()}.Run(ctx, live.Handler{
		Upsert: func(u *unstructured.Unstructured) {
			var r readingsv1.DeviceReading
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &r); err != nil {
				fmt.Fprintf(errOut, "%s reading the live readings: %v\n", time.Now().Format(time.RFC3339Nano), err)
				return
			}
			mu.Lock()
			defer mu.Unlock()
			for _, ch := range LiveChanges(&r, last, time.Now()) {
				print(ch)
			}
		},
		State: func(err error) {
			if err != nil {
				fmt.Fprintf(errOut, "%s %s\n", time.Now().Format(time.RFC3339Nano), live.Describe(err, "DeviceReadings", key.Namespace))
			}
		},
	})
}

// watchDevice prints the Device's changes (but its reported values and
// state when liveReported: the live readings give them) until the Device
// is deleted (then cancel) or ctx ends.
func watchDevice(ctx context.Context, cancel context.CancelFunc, dyn dynamic.Interface, key client.ObjectKey, mu *sync.Mutex, last map[string]string, liveReported bool, print func(Change), errOut io.Writer) {
	live.Watch{Client: dyn, Resource: devices.GVR(), Namespace: key.Namespace, FieldSelector: fields.OneTermEqualSelector("metadata.name", key.Name).String()}.Run(ctx, live.Handler{
		Upsert: func(u *unstructured.Unstructured) {
			d, err := deviceOf(u)
			if err != nil {
				fmt.Fprintf(errOut, "%s reading the device: %v\n", time.Now().Format(time.RFC3339Nano), err)
				return
			}
			if liveReported {
				d = d.DeepCopy()
				d.Status.State = ""
				for i := range d.Status.Twins {
					d.Status.Twins[i].Reported = nil
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for _, ch := range Changes(d, last, time.Now()) {
				print(ch)
			}
		},
		Delete: func(*unstructured.Unstructured) {
			mu.Lock()
			print(Change{Time: time.Now(), Device: key.Name, Field: "deleted"})
			mu.Unlock()
			cancel()
		},
		State: func(err error) {
			if err != nil {
				fmt.Fprintf(errOut, "%s %s\n", time.Now().Format(time.RFC3339Nano), live.Describe(err, "Devices", key.Namespace))
				return
			}
			fmt.Fprintf(errOut, "%s watching again\n", time.Now().Format(time.RFC3339Nano))
		},
	})
}
