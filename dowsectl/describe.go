package dowsectl

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

func newDescribeCommand(c *cli) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "describe TYPE [NAME...] | TYPE/NAME...",
		Short: "Show a Configuration, Instance, DeviceModel or Device with what relates to it",
		Long: `Show objects in detail with what relates to them:
  configuration  each node's view (handler registered, devices seen, discovering,
                 refusals), its Instances, brokers and twins
  instance       its nodes, slots and who holds them, its brokers and its Device
  device         desired against reported per property, conditions, the mapper
  devicemodel    its properties and the Devices of the model
  node           how the cloud reaches it: through its link (the replica
                 holding its session) or directly
and the object's recent Events.`,
		Example:           "  dowsectl describe configuration debug-echo\n  dowsectl describe device boiler-1",
		Args:              cobra.MinimumNArgs(1),
		ValidArgsFunction: c.completeTypeThenNames,
		RunE: func(cmd *cobra.Command, args []string) error {
			if nodes, ok := nodeTargets(args); ok {
				return c.describeNodes(cmd.Context(), nodes)
			}
			targets, err := parseTargets(args)
			if err != nil {
				return err
			}
			return c.describe(cmd.Context(), targets)
		},
	}
	return cmd
}

func (c *cli) describe(ctx context.Context, targets []target) error {
	ns, err := c.namespace()
	if err != nil {
		return err
	}
	cl, err := c.client()
	if err != nil {
		return err
	}
	d := &describer{ctx: ctx, c: cl, ns: ns, now: time.Now()}
	var errs []error
	printed := 0
	for _, t := range targets {
		names := t.names
		if len(names) == 0 {
			if names, err = d.names(t.res); err != nil {
				errs = append(errs, err)
				continue
			}
		}
		for _, name := range names {
			var b strings.Builder
			if err := d.one(&b, t.res, name); err != nil {
				errs = append(errs, err)
				continue
			}
			if printed > 0 {
				fmt.Fprintln(c.streams.Out)
			}
			printed++
			fmt.Fprint(c.streams.Out, b.String())
		}
	}
	if printed == 0 && len(errs) == 0 {
		noneFound(c.streams.ErrOut, ns)
	}
	return errors.Join(errs...)
}

// describer reads what a description needs. Related objects the user may
// not read (brokers, Events) are left out with a note, not a failure.
type describer struct {
	ctx context.Context
	c   client.Client
	ns  string
	now time.Time
}

func (d *describer) names(res resource) ([]string, error) {
	var names []string
	add := func(o client.Object) { names = append(names, o.GetName()) }
	var err error
	switch res.Kind {
	case "Configuration":
		var l v1alpha1.ConfigurationList
		err = d.c.List(d.ctx, &l, client.InNamespace(d.ns))
		for i := range l.Items {
			add(&l.Items[i])
		}
	case "Instance":
		var l v1alpha1.InstanceList
		err = d.c.List(d.ctx, &l, client.InNamespace(d.ns))
		for i := range l.Items {
			add(&l.Items[i])
		}
	case "Device":
		var l v1alpha1.DeviceList
		err = d.c.List(d.ctx, &l, client.InNamespace(d.ns))
		for i := range l.Items {
			add(&l.Items[i])
		}
	case "DeviceModel":
		var l v1alpha1.DeviceModelList
		err = d.c.List(d.ctx, &l, client.InNamespace(d.ns))
		for i := range l.Items {
			add(&l.Items[i])
		}
	}
	return names, err
}

func (d *describer) one(w io.Writer, res resource, name string) error {
	key := client.ObjectKey{Namespace: d.ns, Name: name}
	switch res.Kind {
	case "Configuration":
		var o v1alpha1.Configuration
		if err := d.c.Get(d.ctx, key, &o); err != nil {
			return err
		}
		d.configuration(w, &o)
	case "Instance":
		var o v1alpha1.Instance
		if err := d.c.Get(d.ctx, key, &o); err != nil {
			return err
		}
		d.instance(w, &o)
	case "Device":
		var o v1alpha1.Device
		if err := d.c.Get(d.ctx, key, &o); err != nil {
			return err
		}
		d.device(w, &o)
	case "DeviceModel":
		var o v1alpha1.DeviceModel
		if err := d.c.Get(d.ctx, key, &o); err != nil {
			return err
		}
		d.model(w, &o)
	}
	return nil
}

// section writes a titled table; rows are tab-separated.
func section(w io.Writer, title, header string, rows []string, none string) {
	fmt.Fprintf(w, "%s:\n", title)
	if len(rows) == 0 {
		fmt.Fprintf(w, "  %s\n", none)
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "  %s\n", header)
	for _, r := range rows {
		fmt.Fprintf(tw, "  %s\n", r)
	}
	_ = tw.Flush()
}

func field(w io.Writer, name string, value any) {
	fmt.Fprintf(w, "%-*s%v\n", max(16, len(name)+2), name+":", value)
}

func (d *describer) age(t metav1.Time) string {
	if t.IsZero() {
		return "-"
	}
	return duration.HumanDuration(d.now.Sub(t.Time))
}

func conditionRows(conds []metav1.Condition) []string {
	var rows []string
	for _, c := range conds {
		rows = append(rows, fmt.Sprintf("%s\t%s\t%s\t%s", c.Type, c.Status, orDash(c.Reason), orDash(c.Message)))
	}
	return rows
}

func condStatus(conds []metav1.Condition, typ string) string {
	if c := meta.FindStatusCondition(conds, typ); c != nil {
		return string(c.Status)
	}
	return "-"
}

// forbidden notes a related list the user may not read.
func forbidden(err error) string {
	if apierrors.IsForbidden(err) {
		return "(not allowed to list them: " + err.Error() + ")"
	}
	return "(could not list them: " + err.Error() + ")"
}

func (d *describer) configuration(w io.Writer, cfg *v1alpha1.Configuration) {
	field(w, "Name", cfg.Name)
	field(w, "Namespace", cfg.Namespace)
	field(w, "Handler", cfg.Spec.DiscoveryHandler.Name)
	if dd := cfg.Spec.DiscoveryHandler.DiscoveryDetails; dd != nil {
		field(w, "Details", string(dd.Raw))
	}
	field(w, "Capacity", cfg.Spec.Capacity)
	field(w, "Allocation", cmp.Or(string(cfg.Spec.Allocation), string(v1alpha1.AllocationDevicePlugin)))
	broker := "none"
	if b := cfg.Spec.BrokerSpec; b != nil && b.BrokerPodSpec != nil {
		broker = "a Pod per node that sees a device (" + images(b.BrokerPodSpec.Containers) + ")"
	} else if b != nil && b.BrokerJobSpec != nil {
		broker = "a Job per Instance (" + images(b.BrokerJobSpec.Template.Spec.Containers) + ")"
	}
	field(w, "Broker", broker)
	if t := cfg.Spec.DeviceTemplate; t != nil {
		tmpl := "model " + t.DeviceModelRef.Name
		if t.MapperPodSpec != nil {
			tmpl += ", mapper Pods (" + images(t.MapperPodSpec.Containers) + ")"
		}
		field(w, "Device template", tmpl)
	}
	field(w, "Status", fmt.Sprintf("%d Instances, %d brokers running; %d nodes see devices, %d ready", cfg.Status.Instances, cfg.Status.Brokers, cfg.Status.NodesSeeing, cfg.Status.NodesReady))
	section(w, "Conditions", "TYPE\tSTATUS\tREASON\tMESSAGE", conditionRows(cfg.Status.Conditions), "<none>")

	var nodes []string
	for _, n := range cfg.Status.Nodes {
		msg := ""
		// A handler that refused the details, or properties the agent
		// could not resolve: the refusal, in the agent's words.
		for _, t := range []string{v1alpha1.ConditionDiscovering, v1alpha1.ConditionHandlerAvailable} {
			if c := meta.FindStatusCondition(n.Conditions, t); c != nil && c.Status != metav1.ConditionTrue && msg == "" {
				msg = c.Reason + ": " + c.Message
			}
		}
		since := "-"
		if c := meta.FindStatusCondition(n.Conditions, v1alpha1.ConditionDiscovering); c != nil {
			since = d.age(c.LastTransitionTime)
		}
		nodes = append(nodes, fmt.Sprintf("%s\t%d\t%s\t%s\t%s\t%s", n.NodeName, n.Devices,
			condStatus(n.Conditions, v1alpha1.ConditionHandlerAvailable), condStatus(n.Conditions, v1alpha1.ConditionDiscovering), since, orDash(msg)))
	}
	section(w, "Nodes", "NODE\tDEVICES\tHANDLER\tDISCOVERING\tSINCE\tREFUSAL", nodes, "<none> (no agent reports on this Configuration yet)")
	var skipped []string
	for _, n := range cfg.Status.Nodes {
		for _, sk := range n.Skipped {
			var cands []string
			for _, c := range sk.Candidates {
				cands = append(cands, strings.TrimSpace(c.Candidate+" "+parens(c.Message)))
			}
			skipped = append(skipped, fmt.Sprintf("%s\t%s\t%d\t%s", n.NodeName, sk.Reason, sk.Count, orDash(strings.Join(cands, "; "))))
		}
	}
	if len(skipped) > 0 {
		section(w, "Skipped (looked at, not reported as devices)", "NODE\tREASON\tCOUNT\tCANDIDATES", skipped, "")
	}

	var insts v1alpha1.InstanceList
	if err := d.c.List(d.ctx, &insts, client.InNamespace(cfg.Namespace)); err != nil {
		section(w, "Instances", "", nil, forbidden(err))
	} else {
		var rows []string
		for _, i := range insts.Items {
			if i.Spec.ConfigurationName == cfg.Name {
				rows = append(rows, fmt.Sprintf("%s\t%s\t%d/%d\t%s", i.Name, nodeNames(&i), len(i.Status.Slots), i.Spec.Capacity, d.age(i.CreationTimestamp)))
			}
		}
		section(w, "Instances", "NAME\tNODES\tSLOTS IN USE\tAGE", rows, "<none>")
	}
	d.brokers(w, client.MatchingLabels{v1alpha1.LabelConfiguration: v1alpha1.LabelValue(cfg.Name)}, cfg.Namespace)

	var devs v1alpha1.DeviceList
	if err := d.c.List(d.ctx, &devs, client.InNamespace(cfg.Namespace), client.MatchingLabels{v1alpha1.LabelConfiguration: v1alpha1.LabelValue(cfg.Name)}); err != nil {
		section(w, "Twins", "", nil, forbidden(err))
	} else {
		var rows []string
		for _, dv := range devs.Items {
			rows = append(rows, fmt.Sprintf("%s\t%s\t%s\t%d\t%s", dv.Name, orDash(dv.Spec.NodeName), orDash(dv.Status.State), dv.Status.Differing, lastReport(&dv, d.now)))
		}
		section(w, "Twins", "DEVICE\tNODE\tSTATE\tDIFFERING\tLAST REPORT", rows, "<none>")
	}
	d.events(w, "Configuration", cfg.Name, cfg.Namespace)
}

func parens(s string) string {
	if s == "" {
		return ""
	}
	return "(" + s + ")"
}

func images(cs []corev1.Container) string {
	var out []string
	for _, c := range cs {
		out = append(out, c.Image)
	}
	return strings.Join(out, ", ")
}

func nodeNames(i *v1alpha1.Instance) string {
	var out []string
	for _, n := range i.Status.Nodes {
		out = append(out, n.Name)
	}
	if len(out) == 0 {
		return "-"
	}
	return strings.Join(out, ",")
}

func lastReport(d *v1alpha1.Device, now time.Time) string {
	if t := d.Status.LastReportTime; t != nil && !t.IsZero() {
		return duration.HumanDuration(now.Sub(t.Time)) + " ago"
	}
	return "-"
}

// brokers lists the broker Pods and Jobs the controller made (mapper Pods
// apart).
func (d *describer) brokers(w io.Writer, sel client.MatchingLabels, ns string) {
	var pods corev1.PodList
	if err := d.c.List(d.ctx, &pods, client.InNamespace(ns), sel); err != nil {
		section(w, "Brokers", "", nil, forbidden(err))
		return
	}
	var rows []string
	for _, p := range pods.Items {
		if p.Labels[v1alpha1.LabelMapper] == "true" {
			continue
		}
		rows = append(rows, fmt.Sprintf("pod/%s\t%s\t%s\t%s\t%s", p.Name, orDash(p.Spec.NodeName), orDash(p.Labels[v1alpha1.LabelInstance]), p.Status.Phase, d.age(p.CreationTimestamp)))
	}
	var jobs batchv1.JobList
	if err := d.c.List(d.ctx, &jobs, client.InNamespace(ns), sel); err == nil {
		for _, j := range jobs.Items {
			state := "Running"
			for _, c := range j.Status.Conditions {
				if c.Status == corev1.ConditionTrue && (c.Type == batchv1.JobComplete || c.Type == batchv1.JobFailed) {
					state = string(c.Type)
				}
			}
			rows = append(rows, fmt.Sprintf("job/%s\t-\t%s\t%s\t%s", j.Name, orDash(j.Labels[v1alpha1.LabelInstance]), state, d.age(j.CreationTimestamp)))
		}
	}
	section(w, "Brokers", "BROKER\tNODE\tINSTANCE\tPHASE\tAGE", rows, "<none>")
}

func (d *describer) instance(w io.Writer, i *v1alpha1.Instance) {
	field(w, "Name", i.Name)
	field(w, "Namespace", i.Namespace)
	field(w, "Configuration", i.Spec.ConfigurationName)
	field(w, "Device ID", i.Spec.DeviceID)
	field(w, "Shared", i.Spec.Shared)
	field(w, "Capacity", i.Spec.Capacity)
	var props []string
	for _, k := range slices.Sorted(maps.Keys(i.Spec.BrokerProperties)) {
		props = append(props, k+"\t"+i.Spec.BrokerProperties[k])
	}
	section(w, "Properties", "NAME\tVALUE", props, "<none>")
	var mounts []string
	for _, m := range i.Spec.Mounts {
		mounts = append(mounts, fmt.Sprintf("mount\t%s\t%s", m.HostPath, m.ContainerPath))
	}
	for _, dn := range i.Spec.DeviceSpecs {
		mounts = append(mounts, fmt.Sprintf("device\t%s\t%s", dn.HostPath, dn.ContainerPath))
	}
	if len(mounts) > 0 {
		section(w, "Mounts", "KIND\tHOST\tCONTAINER", mounts, "")
	}
	var nodes []string
	for _, n := range i.Status.Nodes {
		nodes = append(nodes, n.Name)
	}
	section(w, "Nodes", "NODE", nodes, "<none> (no node sees the device)")
	var slots []string
	for _, s := range i.Status.Slots {
		slots = append(slots, fmt.Sprintf("%s\t%s\t%s\t%s", s.ID, s.Node, orDash(s.Resource), orDash(s.AllocationID)))
	}
	section(w, fmt.Sprintf("Slots (%d of %d in use)", len(i.Status.Slots), i.Spec.Capacity), "SLOT\tHELD BY NODE\tRESOURCE\tALLOCATION", slots, "<none>")
	d.brokers(w, client.MatchingLabels{v1alpha1.LabelInstance: v1alpha1.LabelValue(i.Name)}, i.Namespace)
	var dev v1alpha1.Device
	switch err := d.c.Get(d.ctx, client.ObjectKey{Namespace: i.Namespace, Name: i.Name}, &dev); {
	case err == nil && metav1.IsControlledBy(&dev, i):
		field(w, "Device", fmt.Sprintf("%s (node %s, state %s, %d differing, last report %s)", dev.Name, orDash(dev.Spec.NodeName), orDash(dev.Status.State), dev.Status.Differing, lastReport(&dev, d.now)))
	case err == nil:
		field(w, "Device", dev.Name+" exists but is not this Instance's (DeviceNameTaken)")
	case apierrors.IsNotFound(err):
		field(w, "Device", "<none>")
	default:
		field(w, "Device", forbidden(err))
	}
	d.events(w, "Instance", i.Name, i.Namespace)
}

func (d *describer) device(w io.Writer, dev *v1alpha1.Device) {
	field(w, "Name", dev.Name)
	field(w, "Namespace", dev.Namespace)
	model := ""
	if dev.Spec.DeviceModelRef != nil {
		model = dev.Spec.DeviceModelRef.Name
	}
	field(w, "Model", orDash(model))
	field(w, "Node", orDash(dev.Spec.NodeName))
	protocol := dev.Spec.Protocol.ProtocolName
	var m v1alpha1.DeviceModel
	haveModel := model != "" && d.c.Get(d.ctx, client.ObjectKey{Namespace: dev.Namespace, Name: model}, &m) == nil
	if protocol == "" && haveModel {
		protocol = m.Spec.Protocol
	}
	field(w, "Protocol", orDash(protocol))
	mapper := "any mapper of protocol " + orDash(protocol) + " on the node"
	if dev.Spec.MapperName != "" {
		mapper = dev.Spec.MapperName + " (else " + mapper + ")"
	}
	if c := meta.FindStatusCondition(dev.Status.Conditions, v1alpha1.ConditionMapperConnected); c != nil {
		mapper += fmt.Sprintf("; connected %s: %s", c.Status, c.Message)
	}
	field(w, "Mapper", mapper)
	if dev.Spec.NodeName != "" {
		var pods corev1.PodList
		if err := d.c.List(d.ctx, &pods, client.InNamespace(dev.Namespace), client.MatchingLabels{v1alpha1.LabelMapper: "true"}); err == nil {
			for _, p := range pods.Items {
				if p.Spec.NodeName == dev.Spec.NodeName && p.DeletionTimestamp == nil {
					field(w, "Mapper Pod", fmt.Sprintf("%s (%s)", p.Name, p.Status.Phase))
				}
			}
		}
	}
	field(w, "State", orDash(dev.Status.State))
	if t := dev.Status.LastOnlineTime; t != nil {
		field(w, "Last Online", d.age(*t)+" ago")
	}
	field(w, "Last Report", lastReport(dev, d.now))
	field(w, "Differing", fmt.Sprintf("%d properties whose reported value differs from the desired one", dev.Status.Differing))
	var rows []string
	for _, p := range TwinOf(dev).Properties {
		unit, typ := "", ""
		if haveModel {
			if mp := m.Property(p.Name); mp != nil {
				unit, typ = mp.Unit, string(mp.Type)
			}
		}
		mark := ""
		if p.Desired != "" && !twinvalue.Equal(p.Desired, p.Reported) {
			mark = " *"
		}
		problem := p.DesiredError
		if problem == "" {
			problem = p.Error
		}
		rows = append(rows, fmt.Sprintf("%s\t%s\t%s\t%s%s\t%s\t%s\t%s\t%s", p.Name, orDash(typ), orDash(p.Desired), orDash(p.Reported), mark, orDash(unit), age(p.ReportedAt, d.now),
			orDash(p.ObservedDesired), orDash(problem)))
	}
	section(w, "Properties (* reported differs from desired)", "PROPERTY\tTYPE\tDESIRED\tREPORTED\tUNIT\tREAD\tOBSERVED DESIRED\tERROR", rows, "<none>")
	section(w, "Conditions", "TYPE\tSTATUS\tREASON\tMESSAGE", conditionRows(dev.Status.Conditions), "<none>")
	d.events(w, "Device", dev.Name, dev.Namespace)
}

func (d *describer) model(w io.Writer, m *v1alpha1.DeviceModel) {
	field(w, "Name", m.Name)
	field(w, "Namespace", m.Namespace)
	field(w, "Protocol", orDash(m.Spec.Protocol))
	var rows []string
	for _, p := range m.Spec.Properties {
		rows = append(rows, fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s", p.Name, p.Type, cmp.Or(string(p.AccessMode), string(v1alpha1.ReadOnly)), orDash(p.Minimum), orDash(p.Maximum), orDash(p.Unit), orDash(p.Description)))
	}
	section(w, "Properties", "NAME\tTYPE\tACCESS\tMIN\tMAX\tUNIT\tDESCRIPTION", rows, "<none>")
	var devs v1alpha1.DeviceList
	if err := d.c.List(d.ctx, &devs, client.InNamespace(m.Namespace)); err != nil {
		section(w, "Devices", "", nil, forbidden(err))
	} else {
		var rows []string
		for _, dv := range devs.Items {
			if dv.Spec.DeviceModelRef != nil && dv.Spec.DeviceModelRef.Name == m.Name {
				rows = append(rows, fmt.Sprintf("%s\t%s\t%s\t%s", dv.Name, orDash(dv.Spec.NodeName), orDash(dv.Status.State), lastReport(&dv, d.now)))
			}
		}
		section(w, "Devices", "DEVICE\tNODE\tSTATE\tLAST REPORT", rows, "<none>")
	}
	d.events(w, "DeviceModel", m.Name, m.Namespace)
}

// events lists the object's Events, oldest first, as kubectl describe.
func (d *describer) events(w io.Writer, kind, name, ns string) {
	var evs corev1.EventList
	sel := fields.Set{"involvedObject.kind": kind, "involvedObject.name": name, "involvedObject.namespace": ns}.AsSelector()
	if err := d.c.List(d.ctx, &evs, client.InNamespace(ns), client.MatchingFieldsSelector{Selector: sel}); err != nil {
		section(w, "Events", "", nil, forbidden(err))
		return
	}
	items := evs.Items
	slices.SortFunc(items, func(a, b corev1.Event) int { return eventTime(a).Compare(eventTime(b)) })
	var rows []string
	for _, e := range items {
		from := cmp.Or(e.ReportingController, e.Source.Component)
		count := ""
		if n := max(e.Count, seriesCount(e)); n > 1 {
			count = fmt.Sprintf(" (x%d)", n)
		}
		rows = append(rows, fmt.Sprintf("%s\t%s\t%s%s\t%s\t%s", e.Type, e.Reason, duration.HumanDuration(d.now.Sub(eventTime(e))), count, orDash(from), strings.TrimSpace(e.Message)))
	}
	section(w, "Events", "TYPE\tREASON\tAGE\tFROM\tMESSAGE", rows, "<none>")
}

func seriesCount(e corev1.Event) int32 {
	if e.Series != nil {
		return e.Series.Count
	}
	return 0
}

func eventTime(e corev1.Event) time.Time {
	switch {
	case e.Series != nil && !e.Series.LastObservedTime.IsZero():
		return e.Series.LastObservedTime.Time
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}
