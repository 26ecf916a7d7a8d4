package dowsectl

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	acv1alpha1 "github.com/dowse-dev/dowse/shared/api/v1alpha1/applyconfiguration/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/scheme"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// TwinFieldManager is the field manager of `dowsectl twin set`: the desired
// value it sets is then its own, and the controller's template defaults
// never write over it.
const TwinFieldManager = "dowsectl"

const twinUsage = `dowsectl twin get DEVICE      desired, reported and observed desired values, with their age
dowsectl twin set DEVICE PROPERTY VALUE
                              set a desired value (checked against the DeviceModel first)
dowsectl twin watch DEVICE    print each change as it lands

Flags: --kubeconfig PATH, -n/--namespace NS (default: the kubeconfig's, else default)
`

func runTwin(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, twinUsage)
		return ErrUsage
	}
	verb := args[0]
	fs := flag.NewFlagSet("dowsectl twin "+verb, flag.ContinueOnError)
	fs.SetOutput(stderr)
	kubeconfig := fs.String("kubeconfig", "", "path to a kubeconfig; default $KUBECONFIG or ~/.kube/config")
	var ns string
	fs.StringVar(&ns, "namespace", "", "the Device's namespace")
	fs.StringVar(&ns, "n", "", "the Device's namespace (shorthand)")
	// Flags may come after the positional arguments, as with kubectl.
	var pos []string
	rest := args[1:]
	for {
		if err := fs.Parse(rest); err != nil {
			return fmt.Errorf("%w: %v", ErrUsage, err)
		}
		if fs.NArg() == 0 {
			break
		}
		pos = append(pos, fs.Arg(0))
		rest = fs.Args()[1:]
	}
	want := map[string]int{"get": 1, "set": 3, "watch": 1}
	n, ok := want[verb]
	if !ok || len(pos) != n {
		fmt.Fprint(stderr, twinUsage)
		return ErrUsage
	}
	cfg, err := restConfig(*kubeconfig)
	if err != nil {
		return err
	}
	if ns == "" {
		rules := clientcmd.NewDefaultClientConfigLoadingRules()
		rules.ExplicitPath = *kubeconfig
		if ns, _, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).Namespace(); err != nil || ns == "" {
			ns = "default"
		}
	}
	sch, err := scheme.New()
	if err != nil {
		return err
	}
	c, err := client.NewWithWatch(cfg, client.Options{Scheme: sch})
	if err != nil {
		return err
	}
	key := client.ObjectKey{Namespace: ns, Name: pos[0]}
	switch verb {
	case "get":
		var d v1alpha1.Device
		if err := c.Get(ctx, key, &d); err != nil {
			return err
		}
		return PrintTwin(stdout, &d, time.Now())
	case "set":
		return SetDesired(ctx, c, key, pos[1], pos[2])
	}
	return watchTwin(ctx, c, key, stdout)
}

// PrintTwin writes the Device's twin as a table.
func PrintTwin(w io.Writer, d *v1alpha1.Device, now time.Time) error {
	fmt.Fprintf(w, "Device %s/%s  model %s  node %s  state %s  last report %s\n", d.Namespace, d.Name,
		d.Spec.DeviceModelRef.Name, orDash(d.Spec.NodeName), orDash(d.Status.State), ageOfTime(d.Status.LastReportTime, now))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "PROPERTY\tDESIRED\tREPORTED\tREPORTED AGE\tOBSERVED DESIRED\tOBSERVED AGE")
	for _, name := range propertyNames(d) {
		desired := "-"
		if p := d.Property(name); p != nil && p.Desired != nil {
			desired = p.Desired.Value
		}
		rep, repAge, obs, obsAge := "-", "-", "-", "-"
		for _, t := range d.Status.Twins {
			if t.PropertyName != name {
				continue
			}
			if t.Reported != nil {
				rep, repAge = t.Reported.Value, age(t.Reported.Metadata, now)
			}
			if t.ObservedDesired != nil {
				obs, obsAge = t.ObservedDesired.Value, age(t.ObservedDesired.Metadata, now)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", name, desired, rep, repAge, obs, obsAge)
	}
	return tw.Flush()
}

func propertyNames(d *v1alpha1.Device) []string {
	var names []string
	for _, p := range d.Spec.Properties {
		names = append(names, p.Name)
	}
	for _, t := range d.Status.Twins {
		if !slices.Contains(names, t.PropertyName) {
			names = append(names, t.PropertyName)
		}
	}
	return names
}

// age is how old a twin value is by its timestamp metadata.
func age(md map[string]string, now time.Time) string {
	at, ok := twinvalue.TimestampOf(md)
	if !ok {
		return "-"
	}
	return now.Sub(at).Round(time.Millisecond * 100).String()
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
// minimum and maximum), as server-side apply under TwinFieldManager.
func SetDesired(ctx context.Context, c client.Client, key client.ObjectKey, property, value string) error {
	var d v1alpha1.Device
	if err := c.Get(ctx, key, &d); err != nil {
		return err
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

func watchTwin(ctx context.Context, c client.WithWatch, key client.ObjectKey, w io.Writer) error {
	var list v1alpha1.DeviceList
	wi, err := c.Watch(ctx, &list, client.InNamespace(key.Namespace), client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", key.Name)})
	if err != nil {
		return err
	}
	defer wi.Stop()
	last := map[string]string{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-wi.ResultChan():
			if !ok {
				return fmt.Errorf("watch of %s ended", key)
			}
			if ev.Type == watch.Deleted {
				fmt.Fprintf(w, "%s device deleted\n", time.Now().Format(time.RFC3339Nano))
				return nil
			}
			d, ok := ev.Object.(*v1alpha1.Device)
			if !ok {
				continue
			}
			for _, line := range Changes(d, last) {
				fmt.Fprintf(w, "%s %s\n", time.Now().Format(time.RFC3339Nano), line)
			}
		}
	}
}

// Changes lists what changed in d since last (updated in place): one line
// per desired, reported or observed desired value, and the state.
func Changes(d *v1alpha1.Device, last map[string]string) []string {
	var out []string
	note := func(k, v string) {
		if last[k] != v {
			last[k] = v
			out = append(out, fmt.Sprintf("%s=%s", k, v))
		}
	}
	if d.Status.State != "" {
		note("state", d.Status.State)
	}
	for _, p := range d.Spec.Properties {
		if p.Desired != nil {
			note(p.Name+".desired", p.Desired.Value)
		}
	}
	for _, t := range d.Status.Twins {
		if t.Reported != nil {
			note(t.PropertyName+".reported", t.Reported.Value)
		}
		if t.ObservedDesired != nil {
			note(t.PropertyName+".observedDesired", t.ObservedDesired.Value)
		}
	}
	return out
}
