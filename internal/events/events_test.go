package events

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
)

func TestRecorderSendsAndBounds(t *testing.T) {
	cs := fake.NewClientset()
	r := New(cs.EventsV1(), scheme.Scheme, "dowse-controller", "dowse_controller", 2, nil)
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns", UID: "u1"}}
	svc := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "s", Namespace: "ns"}}
	// Nothing sends yet: the third event finds the queue full.
	for range 3 {
		r.Eventf(pod, svc, corev1.EventTypeNormal, "BrokerCreated", "CreateBroker", "created %s", "s")
	}
	if got := testutil.ToFloat64(r.dropped); got != 1 {
		t.Fatalf("dropped %v, want 1", got)
	}
	r.Eventf(&struct{ corev1.Pod }{}, nil, corev1.EventTypeNormal, "X", "Y", "not in the scheme")
	if got := testutil.ToFloat64(r.dropped); got != 2 {
		t.Fatalf("dropped %v after an object without reference, want 2", got)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Start(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for testutil.ToFloat64(r.sent) < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	list, err := cs.EventsV1().Events("ns").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 2 {
		t.Fatalf("%d events, want 2", len(list.Items))
	}
	ev := list.Items[0]
	if ev.Regarding.Name != "p" || ev.Regarding.Kind != "Pod" || ev.Related == nil || ev.Related.Name != "s" ||
		ev.Note != "created s" || ev.ReportingController != "dowse-controller" || ev.EventTime.IsZero() {
		t.Fatalf("event %+v", ev)
	}
}
