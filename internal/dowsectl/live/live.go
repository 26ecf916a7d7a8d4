// Package live keeps a view of API objects current for dowsectl's long
// running commands (twin watch, twin set --wait, the console): a client-go
// informer, so that a watch that expires or an API server that restarts
// costs a relist, not the command, plus the health of the connection in
// words the user can act on.
package live

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/tools/cache"

	readingsv1 "github.com/dowse-dev/dowse/shared/api/readings/v1alpha1"
)

// Watch is one resource's objects in one namespace ("" for all), narrowed
// by selectors.
type Watch struct {
	Client        dynamic.Interface
	Resource      schema.GroupVersionResource
	Namespace     string
	FieldSelector string
	LabelSelector string
}

// Handler gets what a Watch sees. Calls come from one goroutine at a
// time, in order. Any func may be nil.
type Handler struct {
	// Upsert is an object added or changed (also after a relist).
	Upsert func(*unstructured.Unstructured)
	// Delete is an object gone.
	Delete func(*unstructured.Unstructured)
	// Synced is called once the first complete list has been delivered.
	Synced func()
	// State is called with an error when a list or watch fails (the
	// informer retries with backoff), and with nil when one succeeds after
	// a failure.
	State func(err error)
}

// Run delivers events until ctx ends.
func (w Watch) Run(ctx context.Context, h Handler) {
	ri := w.Client.Resource(w.Resource).Namespace(w.Namespace)
	var mu sync.Mutex
	failing := false
	report := func(err error) {
		if h.State == nil || ctx.Err() != nil {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if err == nil && !failing {
			return
		}
		failing = err != nil
		h.State(err)
	}
	narrow := func(o *metav1.ListOptions) {
		o.FieldSelector, o.LabelSelector = w.FieldSelector, w.LabelSelector
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			narrow(&o)
			l, err := ri.List(ctx, o)
			report(err)
			return l, err
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			narrow(&o)
			wi, err := ri.Watch(ctx, o)
			report(err)
			return wi, err
		},
	}
	inf := cache.NewSharedIndexInformerWithOptions(lw, &unstructured.Unstructured{}, cache.SharedIndexInformerOptions{})
	_ = inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) { report(err) })
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(o any) {
			if u, ok := o.(*unstructured.Unstructured); ok && h.Upsert != nil {
				h.Upsert(u)
			}
		},
		UpdateFunc: func(_, o any) {
			if u, ok := o.(*unstructured.Unstructured); ok && h.Upsert != nil {
				h.Upsert(u)
			}
		},
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if u, ok := o.(*unstructured.Unstructured); ok && h.Delete != nil {
				h.Delete(u)
			}
		},
	})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		inf.RunWithContext(ctx)
	}()
	if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) && h.Synced != nil {
		h.Synced()
	}
	wg.Wait()
}

// ReadingsServed says whether the API server serves the live readings
// API (readings.dowse.dev: its APIService registered and available). It
// asks each time (no cache): an APIService registered or removed later is
// seen on the next call. An unavailable APIService, like none, is false.
func ReadingsServed(dc discovery.DiscoveryInterface) bool {
	rl, err := dc.ServerResourcesForGroupVersion(readingsv1.GroupVersion.String())
	if err != nil {
		return false
	}
	for _, r := range rl.APIResources {
		if r.Name == readingsv1.Resource {
			return true
		}
	}
	return false
}

// Describe says what err means for the user, for what (e.g. "Devices") in
// namespace ns ("" for all namespaces).
func Describe(err error, what, ns string) string {
	where := "in namespace " + ns
	if ns == "" {
		where = "in any namespace"
	}
	var status apierrors.APIStatus
	switch {
	case apierrors.IsForbidden(err):
		return fmt.Sprintf("No right to read %s %s: %s", what, where, message(err))
	case apierrors.IsUnauthorized(err):
		return fmt.Sprintf("The API server does not accept your credentials (log in again or check the kubeconfig): %s", message(err))
	case apierrors.IsNotFound(err) && strings.Contains(message(err), "the server could not find the requested resource"):
		return fmt.Sprintf("The API server does not serve %s: are Dowse's CRDs installed (kubectl apply -f deploy/crds)?", what)
	case apierrors.IsResourceExpired(err) || apierrors.IsGone(err):
		return fmt.Sprintf("The watch of %s expired; listing again", what)
	case Unreachable(err):
		return fmt.Sprintf("API server unreachable (%v); retrying", rootCause(err))
	case errors.As(err, &status):
		return fmt.Sprintf("The API server refused to list %s %s: %s", what, where, message(err))
	}
	return fmt.Sprintf("The watch of %s broke (%v); reconnecting", what, err)
}

// Unreachable says whether err is a failure to reach the API server at
// all (refused, reset, unresolvable, timed out).
func Unreachable(err error) bool {
	if errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) {
		return true
	}
	var dns *net.DNSError
	if errors.As(err, &dns) {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func rootCause(err error) error {
	var op *net.OpError
	if errors.As(err, &op) {
		return op
	}
	return err
}

func message(err error) string {
	var status apierrors.APIStatus
	if errors.As(err, &status) {
		return status.Status().Message
	}
	return err.Error()
}
