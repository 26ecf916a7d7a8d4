package dowsectl

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/dowse-dev/dowse/internal/controller/link/ownership"
)

// nodeWords are the ways describe's TYPE names a Node.
var nodeWords = []string{"node", "nodes", "no"}

// nodeTargets reads describe's arguments when they name Nodes: "node A B"
// or "node/A"; ok is false for Dowse's own kinds.
func nodeTargets(args []string) (names []string, ok bool) {
	if slices.Contains(nodeWords, strings.ToLower(args[0])) {
		return args[1:], true
	}
	for _, a := range args {
		kind, name, found := strings.Cut(a, "/")
		if !found || !slices.Contains(nodeWords, strings.ToLower(kind)) {
			return nil, false
		}
		names = append(names, name)
	}
	return names, true
}

// describeNodes says how the cloud reaches each node: through its link
// (which replica holds its session, whether that replica is present) or
// directly, for the API server's logs, exec and port-forward.
func (c *cli) describeNodes(ctx context.Context, names []string) error {
	cs, err := c.kube()
	if err != nil {
		return err
	}
	if len(names) == 0 {
		l, err := cs.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		for _, n := range l.Items {
			names = append(names, n.Name)
		}
	}
	var errs []error
	for i, name := range names {
		if i > 0 {
			fmt.Fprintln(c.streams.Out)
		}
		if err := c.describeNode(ctx, cs, c.streams.Out, name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (c *cli) describeNode(ctx context.Context, cs kubernetes.Interface, out io.Writer, name string) error {
	node, err := cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(out, 0, 8, 1, ' ', 0)
	defer w.Flush()
	fmt.Fprintf(w, "Name:\t%s\n", node.Name)
	ready := "Unknown"
	for _, cond := range node.Status.Conditions {
		if cond.Type == corev1.NodeReady {
			ready = string(cond.Status)
		}
	}
	fmt.Fprintf(w, "Ready:\t%s\n", ready)
	var addrs []string
	for _, a := range node.Status.Addresses {
		addrs = append(addrs, fmt.Sprintf("%s (%s)", a.Address, a.Type))
	}
	fmt.Fprintf(w, "Addresses:\t%s\n", orDash(strings.Join(addrs, ", ")))
	leases := cs.CoordinationV1().Leases(c.controllerNamespace())
	record, err := leases.Get(ctx, ownership.NodeLeaseName(node.Name), metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		fmt.Fprintf(w, "Link:\tnone: the node has never held a link session\n")
		fmt.Fprintf(w, "Reached:\tdirectly (the API server dials its kubelet)\n")
		return nil
	case apierrors.IsForbidden(err):
		fmt.Fprintf(w, "Link:\tunknown: you may not read the link's records in %s\n", c.controllerNamespace())
		return nil
	case err != nil:
		return err
	}
	holder := ptr.Deref(record.Spec.HolderIdentity, "")
	since := "-"
	if t := record.Spec.AcquireTime; t != nil {
		since = t.Format(time.RFC3339)
	}
	fmt.Fprintf(w, "Link:\tsession held by replica %s (epoch %d, since %s)\n", orDash(holder), ptr.Deref(record.Spec.LeaseTransitions, 0), since)
	present, err := leases.Get(ctx, ownership.ReplicaLeaseName(holder), metav1.GetOptions{})
	switch {
	case err == nil && ownership.Serving(present, time.Now()):
		fmt.Fprintf(w, "Reached:\tthrough its link, via replica %s (the controller's egress carries logs, exec, port-forward and the proxy)\n", holder)
	case err == nil || apierrors.IsNotFound(err):
		fmt.Fprintf(w, "Reached:\tnot now: replica %s, which held its session, is gone; the node's link reconnects to another\n", holder)
	default:
		fmt.Fprintf(w, "Reached:\tunknown: %v\n", err)
	}
	return nil
}
