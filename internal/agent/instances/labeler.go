package instances

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/dowse-dev/dowse/internal/instancestore"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// LabelledMarker, in the agent's state directory, records that the
// Labeler went through the cluster's Instances once on this node.
const LabelledMarker = "instances-labelled"

// Labeler gives the node's label (v1alpha1.NodeLabel) to the Instances
// that list the node but were written before the label existed: the
// agent's cache selects on it, so without it such an Instance is invisible
// (never released when its device goes, no device plugin) until discovery
// happens to apply it again. It goes through the cluster's Instances once,
// a page at a time, on the first start of an agent that has not done so
// (LabelledMarker), and retries until it has.
type Labeler struct {
	Client   client.Client // writes
	Reader   client.Reader // lists, from the API server
	Node     string
	StateDir string
	// Namespace limits it to one namespace (the agent's --namespace).
	Namespace string
	Log       logr.Logger
}

// Start labels, then returns (a Runnable that ends); errors are logged
// and retried with backoff until ctx ends.
func (l *Labeler) Start(ctx context.Context) error {
	marker := filepath.Join(l.StateDir, LabelledMarker)
	if _, err := os.Stat(marker); err == nil {
		return nil
	}
	for wait := time.Second; ; wait = min(2*wait, time.Minute) {
		n, err := l.Label(ctx)
		if err == nil {
			if n > 0 {
				l.Log.Info("labelled Instances written before the node label", "instances", n)
			}
			if err := os.WriteFile(marker, []byte(v1alpha1.NodeLabel(l.Node)+"\n"), 0o644); err != nil {
				l.Log.Error(err, "recording that Instances are labelled; doing it again at the next start")
			}
			return nil
		}
		l.Log.Error(err, "labelling Instances written before the node label; retrying", "in", wait)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// Label labels every Instance that lists the node and lacks the label,
// and returns how many it labelled.
func (l *Labeler) Label(ctx context.Context) (int, error) {
	unlabelled, err := labels.NewRequirement(v1alpha1.NodeLabel(l.Node), selection.DoesNotExist, nil)
	if err != nil {
		return 0, err
	}
	opts := []client.ListOption{client.MatchingLabelsSelector{Selector: labels.NewSelector().Add(*unlabelled)}, client.Limit(200)}
	if l.Namespace != "" {
		opts = append(opts, client.InNamespace(l.Namespace))
	}
	n := 0
	for cont := ""; ; {
		var page v1alpha1.InstanceList
		if err := l.Reader.List(ctx, &page, append(opts, client.Continue(cont))...); err != nil {
			return n, fmt.Errorf("listing Instances: %w", err)
		}
		for i := range page.Items {
			inst := &page.Items[i]
			if !inst.HasNode(l.Node) || inst.DeletionTimestamp != nil {
				continue
			}
			if err := instancestore.Label(ctx, l.Client, l.Node, inst); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
				return n, fmt.Errorf("labelling Instance %s: %w", client.ObjectKeyFromObject(inst), err)
			}
			n++
		}
		if cont = page.Continue; cont == "" {
			return n, nil
		}
	}
}
