package propertyrefs

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/dowse-dev/dowse/test/framework/promtest"
)

type notes struct {
	mu  sync.Mutex
	got map[types.NamespacedName]int
}

func (n *notes) notify(owners []types.NamespacedName) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, o := range owners {
		n.got[o]++
	}
}

func (n *notes) count(o types.NamespacedName) int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.got[o]
}

func eventually(t *testing.T, what string, f func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !f(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func start(t *testing.T, cs *fake.Clientset, reg prometheus.Registerer) (*Watcher, *notes) {
	t.Helper()
	n := &notes{got: map[types.NamespacedName]int{}}
	w := New(cs, n.notify, NewMetrics(reg), testr.New(t))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return w, n
}

func TestValuesAndChanges(t *testing.T) {
	cs := fake.NewClientset(
		&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cred"}, Data: map[string][]byte{"password": []byte("one")}},
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cm"}, Data: map[string]string{"url": "opc.tcp://a"}, BinaryData: map[string][]byte{"blob": {1, 2}}},
	)
	reg := prometheus.NewRegistry()
	w, n := start(t, cs, reg)
	owner := types.NamespacedName{Namespace: "ns", Name: "cfg"}
	sec := Ref{Secret, types.NamespacedName{Namespace: "ns", Name: "cred"}}
	cm := Ref{ConfigMap, types.NamespacedName{Namespace: "ns", Name: "cm"}}
	absent := Ref{Secret, types.NamespacedName{Namespace: "ns", Name: "absent"}}
	w.Set(owner, []Ref{sec, cm, absent})
	if got := promtest.Sum(t, reg, "dowse_agent_property_objects_watched", nil); got != 3 {
		t.Errorf("watched gauge %v, want 3", got)
	}

	eventually(t, "the objects read", func() bool {
		_, _, e1 := w.Value(sec, "password")
		_, _, e2 := w.Value(absent, "k")
		return e1 == nil && e2 == nil && n.count(owner) > 0
	})
	for _, c := range []struct {
		ref   Ref
		key   string
		want  string
		found bool
	}{
		{sec, "password", "one", true}, {sec, "other", "", false},
		{cm, "url", "opc.tcp://a", true}, {cm, "blob", "\x01\x02", true},
		{absent, "k", "", false},
	} {
		v, found, err := w.Value(c.ref, c.key)
		if err != nil || found != c.found || string(v) != c.want {
			t.Errorf("%s %s = %q %v %v, want %q %v", c.ref, c.key, v, found, err, c.want, c.found)
		}
	}

	before := n.count(owner)
	s, _ := cs.CoreV1().Secrets("ns").Get(context.Background(), "cred", metav1.GetOptions{})
	s.Data["password"] = []byte("two")
	s.ResourceVersion = "2"
	if _, err := cs.CoreV1().Secrets("ns").Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the new value", func() bool {
		v, _, _ := w.Value(sec, "password")
		return string(v) == "two" && n.count(owner) > before
	})

	// Another owner of the same object shares its watch; the last owner
	// gone, the watch stops.
	other := types.NamespacedName{Namespace: "ns", Name: "other"}
	w.Set(other, []Ref{sec})
	if got := len(w.Watched()); got != 3 {
		t.Fatalf("%d watches, want 3", got)
	}
	w.Set(owner, nil)
	if got := w.Watched(); len(got) != 1 || got[0] != sec {
		t.Fatalf("watched %v, want only %s", got, sec)
	}
	if _, _, err := w.Value(cm, "url"); err == nil {
		t.Fatal("an object nobody reads still has a value")
	}
	w.Set(other, nil)
	if got := w.Watched(); len(got) != 0 {
		t.Fatalf("watched %v after the last owner went", got)
	}
}

// A refused read is reported (and the owners told) until it succeeds; the
// watch retries by itself.
func TestForbiddenUntilGranted(t *testing.T) {
	cs := fake.NewClientset(&corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "cred"}, Data: map[string][]byte{"k": []byte("v")}})
	var granted atomic.Bool
	cs.PrependReactor("list", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if granted.Load() {
			return false, nil, nil
		}
		return true, nil, apierrors.NewForbidden(corev1.Resource("secrets"), "", errors.New("no rule"))
	})
	reg := prometheus.NewRegistry()
	w, n := start(t, cs, reg)
	owner := types.NamespacedName{Namespace: "ns", Name: "cfg"}
	ref := Ref{Secret, types.NamespacedName{Namespace: "ns", Name: "cred"}}
	w.reportAfter = 2 * time.Second
	begin := time.Now()
	w.Set(owner, []Ref{ref})
	// Refused at once, but reported only after reportAfter: until then the
	// controller may be about to grant it.
	eventually(t, "the first refusal", func() bool { return n.count(owner) > 0 })
	if _, _, err := w.Value(ref, "k"); !errors.Is(err, ErrPending) && time.Since(begin) < w.reportAfter {
		t.Fatalf("a refusal %v after the watch started: %v, want ErrPending", time.Since(begin), err)
	}
	eventually(t, "the refusal", func() bool {
		_, _, err := w.Value(ref, "k")
		return apierrors.IsForbidden(err) && n.count(owner) > 0
	})
	told := n.count(owner)
	if got := promtest.Sum(t, reg, "dowse_agent_property_read_failures_total", map[string]string{"reason": "Forbidden"}); got < 1 {
		t.Errorf("%v Forbidden failures counted", got)
	}
	granted.Store(true)
	eventually(t, "the value once granted", func() bool {
		v, found, err := w.Value(ref, "k")
		return err == nil && found && string(v) == "v" && n.count(owner) > told
	})
}

func TestValueOfUnwatched(t *testing.T) {
	w := New(fake.NewClientset(), func([]types.NamespacedName) {}, nil, testr.New(t))
	if _, _, err := w.Value(Ref{Secret, types.NamespacedName{Namespace: "a", Name: "b"}}, "k"); err == nil {
		t.Fatal("no error for an object nobody Set")
	}
	// Set before Start holds the watch until Start; nothing runs yet.
	w.Set(types.NamespacedName{Name: "o"}, []Ref{{ConfigMap, types.NamespacedName{Namespace: "a", Name: "b"}}})
	if _, _, err := w.Value(Ref{ConfigMap, types.NamespacedName{Namespace: "a", Name: "b"}}, "k"); !errors.Is(err, ErrPending) {
		t.Fatalf("before Start: %v, want ErrPending", err)
	}
	w.Set(types.NamespacedName{Name: "o"}, nil)
}
