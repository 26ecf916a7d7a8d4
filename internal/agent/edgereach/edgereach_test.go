package edgereach

import (
	"context"
	"errors"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
)

// away is a reader whose API server went away after the first read.
type away struct {
	client.Reader
	reads int
}

func (a *away) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	a.reads++
	if a.reads > 1 {
		return errors.New("connection refused")
	}
	return a.Reader.Get(ctx, key, obj, opts...)
}

func TestCheck(t *testing.T) {
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "edge-1"},
		Spec: corev1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24", "fd00:1::/64"}},
		Status: corev1.NodeStatus{
			Addresses:       []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.0.0.5"}, {Type: corev1.NodeHostName, Address: "edge-1.lan"}},
			DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: 10250}},
		}}
	reader := &away{Reader: fake.NewClientBuilder().WithObjects(node).Build()}
	r := New("edge-1", reader, nil)
	for _, tc := range []struct {
		target string
		ok     bool
	}{
		{"10.0.0.5:10250", true},
		{"edge-1:10250", true},
		{"edge-1.lan:10250", true},
		{"10.244.1.7:8080", true},
		{"[fd00:1::7]:80", true},
		{"10.0.0.5:22", false},        // the node, not its kubelet
		{"10.0.0.6:10250", false},     // another host of the LAN
		{"10.244.2.7:80", false},      // another node's pod
		{"example.com:80", false},     // a name
		{"169.254.169.254:80", false}, // the cloud's metadata service
		{"10.244.1.7", false},         // no port
		{"10.244.1.7:0", false},
	} {
		_, err := r.Check(t.Context(), tc.target)
		if (err == nil) != tc.ok {
			t.Errorf("Check(%s) = %v, want allowed %v", tc.target, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrRefused) {
			t.Errorf("Check(%s) = %v, not ErrRefused", tc.target, err)
		}
	}
	// The API server gone: the Node last read still serves.
	r.fetched = r.fetched.Add(-2 * refreshEvery)
	if _, err := r.Check(t.Context(), "10.244.1.9:80"); err != nil || reader.reads < 2 {
		t.Errorf("offline Check = %v after %d reads, want the Node last read to serve", err, reader.reads)
	}
	// Never read: refused, saying so.
	if _, err := New("edge-2", reader, nil).Check(t.Context(), "10.244.1.9:80"); err == nil {
		t.Error("a node never read allows a target")
	}
}
