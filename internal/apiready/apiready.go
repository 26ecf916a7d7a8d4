// Package apiready waits, at a process's start, until the API server
// answers and serves the kinds the process needs, saying what it waits
// for. A component started before its CRDs are installed, or while the API
// server is away, then waits instead of exiting with controller-runtime's
// "no matches for kind". Later, requests that cannot connect to the API
// server wait for it (HoldRequests, HoldListsAndWatches) rather than fail
// into client back-offs that outlast an outage.
package apiready

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"

	"github.com/dowse-dev/dowse/internal/backoff"
)

// Kinds are the object kinds sch knows in gv: those with a List kind
// beside them (not the options and events every group registers).
func Kinds(sch *runtime.Scheme, gv schema.GroupVersion) []string {
	known := sch.KnownTypes(gv)
	var kinds []string
	for k := range known {
		if _, ok := known[k+"List"]; ok {
			kinds = append(kinds, k)
		}
	}
	slices.Sort(kinds)
	return kinds
}

// Waiter checks and waits; Every is how often a wait that goes on is
// logged again (30 s when zero).
type Waiter struct {
	Discovery discovery.DiscoveryInterface
	Log       logr.Logger
	Every     time.Duration
}

// New is a Waiter on the API server of cfg.
func New(cfg *rest.Config, log logr.Logger) (*Waiter, error) {
	d, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Waiter{Discovery: d, Log: log}, nil
}

// Wait returns once the API server serves every kind of gv, or an error
// when ctx ends first.
func (w *Waiter) Wait(ctx context.Context, gv schema.GroupVersion, kinds []string) error {
	every := w.Every
	if every <= 0 {
		every = 30 * time.Second
	}
	start := time.Now()
	var lastLog time.Time
	wait := backoff.Backoff{Initial: 500 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.2}
	for {
		err := w.check(gv, kinds)
		if err == nil {
			if !lastLog.IsZero() {
				w.Log.Info("the API server serves what this process needs", "groupVersion", gv.String(), "waited", time.Since(start).Round(time.Millisecond))
			}
			return nil
		}
		if lastLog.IsZero() || time.Since(lastLog) >= every {
			w.Log.Info("waiting for the API server", "reason", err.Error(), "waited", time.Since(start).Round(time.Second))
			lastLog = time.Now()
		}
		if !backoff.Sleep(ctx, wait.Next()) {
			return fmt.Errorf("gave up waiting for the API server: %w", err)
		}
	}
}

// check says what the API server does not serve yet, or nil.
func (w *Waiter) check(gv schema.GroupVersion, kinds []string) error {
	list, err := w.Discovery.ServerResourcesForGroupVersion(gv.String())
	if err != nil {
		if apierrors.IsNotFound(err) {
			return fmt.Errorf("it does not serve %s yet (none of %s): install Dowse's CRDs (kubectl apply -f deploy/crds, or the Helm chart)", gv, strings.Join(kinds, ", "))
		}
		return fmt.Errorf("cannot ask it what it serves: %w", err)
	}
	served := map[string]bool{}
	for _, r := range list.APIResources {
		if !strings.Contains(r.Name, "/") {
			served[r.Kind] = true
		}
	}
	var missing []string
	for _, k := range kinds {
		if !served[k] {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("it does not serve %s %s yet: install Dowse's CRDs (kubectl apply -f deploy/crds, or the Helm chart)", gv, strings.Join(missing, ", "))
	}
	return nil
}

// Await waits until the API server of cfg serves every kind sch knows in
// gv, logging through log what it waits for.
func Await(ctx context.Context, cfg *rest.Config, sch *runtime.Scheme, gv schema.GroupVersion, log logr.Logger) error {
	w, err := New(cfg, log)
	if err != nil {
		return err
	}
	return w.Wait(ctx, gv, Kinds(sch, gv))
}
