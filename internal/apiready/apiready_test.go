package apiready

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	fakediscovery "k8s.io/client-go/discovery/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/dowse-dev/dowse/internal/scheme"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// TestKinds: the object kinds of a group, without the options and event
// kinds every group registers.
func TestKinds(t *testing.T) {
	sch, err := scheme.New()
	if err != nil {
		t.Fatal(err)
	}
	if got := Kinds(sch, v1alpha1.GroupVersion); !slices.Equal(got, []string{"Configuration", "Device", "DeviceModel", "Instance"}) {
		t.Fatalf("Kinds = %v", got)
	}
}

// TestWaitNamesWhatIsMissing: a group served without one of its kinds is
// waited for, and the error at the end names the missing kind.
func TestWaitNamesWhatIsMissing(t *testing.T) {
	d := &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{}}
	d.Resources = []*metav1.APIResourceList{{GroupVersion: v1alpha1.GroupVersion.String(), APIResources: []metav1.APIResource{
		{Name: "configurations", Kind: "Configuration"}, {Name: "instances/status", Kind: "Instance"},
	}}}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err := (&Waiter{Discovery: d, Log: logr.Discard()}).Wait(ctx, v1alpha1.GroupVersion, []string{"Configuration", "Instance"})
	if err == nil || !strings.Contains(err.Error(), "Instance") || strings.Contains(err.Error(), "Configuration,") {
		t.Fatalf("Wait = %v, want an error naming Instance alone", err)
	}
	d.Resources[0].APIResources = append(d.Resources[0].APIResources, metav1.APIResource{Name: "instances", Kind: "Instance"})
	if err := (&Waiter{Discovery: d, Log: logr.Discard()}).Wait(context.Background(), v1alpha1.GroupVersion, []string{"Configuration", "Instance"}); err != nil {
		t.Fatal(err)
	}
}
