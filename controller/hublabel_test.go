package controller

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

// TestHubLabel: the leader's Pod carries the label while it runs and loses
// it when it stops; a stale label (a container that died as leader) is
// cleared.
func TestHubLabel(t *testing.T) {
	cs := fake.NewClientset(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "dowse-system", Name: "ctl-0",
		Labels: map[string]string{"app": "dowse-controller", LabelCloudhub: "leader"}}})
	pods := cs.CoreV1().Pods("dowse-system")
	label := func() (string, bool) {
		p, err := pods.Get(context.Background(), "ctl-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Labels["app"] != "dowse-controller" {
			t.Fatalf("other labels lost: %v", p.Labels)
		}
		v, ok := p.Labels[LabelCloudhub]
		return v, ok
	}
	h := hubLabel{pods: pods, name: "ctl-0", log: logr.Discard()}
	h.clear(context.Background())
	if v, ok := label(); ok {
		t.Fatalf("stale label %q not cleared", v)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.Start(ctx) }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if v, _ := label(); v == "leader" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the leader's pod was not labelled")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if v, ok := label(); ok {
		t.Fatalf("label %q left after the leader stopped", v)
	}
	if !h.NeedLeaderElection() {
		t.Fatal("the label must follow the lease")
	}
}
