package twins

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dowse-dev/dowse/internal/controller/link/cloudhub"
	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/test/framework/testwait"
)

// TestEdgeConditions: a node's DeviceCondition is written to the Device's
// status (ReportsAccepted naming the refused property, then True again);
// a condition type a node does not set (Valid) is dropped; a reason the API
// server would refuse is replaced rather than failing the write.
func TestEdgeConditions(t *testing.T) {
	ctx := context.Background()
	ns := suite.Namespace(t)
	if err := suite.Client.Create(ctx, thermostatModel(ns)); err != nil {
		t.Fatal(err)
	}
	if err := suite.Client.Create(ctx, device(ns, "c1", "edge-1")); err != nil {
		t.Fatal(err)
	}
	rig := startTwins(t, newFakeHub())
	testwait.For(t, 10*time.Second, func() error {
		_, err := getDevice(ns, "c1")
		return err
	})
	seq := uint64(0)
	send := func(c *linkv1.DeviceCondition) {
		t.Helper()
		seq++
		c.Device, c.Time = &linkv1.DeviceRef{Namespace: ns, Name: "c1"}, timestamppb.New(time.Unix(1_800_000_000+int64(seq), 0))
		if err := rig.status.Handle(ctx, cloudhub.Inbound{Node: "edge-1", At: cloudhub.Position{Stream: 5, Seq: seq},
			Env: &linkv1.Envelope{Seq: seq, Kind: &linkv1.Envelope_DeviceCondition{DeviceCondition: c}}}); err != nil {
			t.Fatal(err)
		}
		rig.status.Flush(ctx)
	}
	cond := func(typ string) (*metav1.Condition, error) {
		d, err := getDevice(ns, "c1")
		if err != nil {
			return nil, err
		}
		c := meta.FindStatusCondition(d.Status.Conditions, typ)
		if c == nil {
			return nil, fmt.Errorf("no %s condition: %+v", typ, d.Status.Conditions)
		}
		return c, nil
	}

	send(&linkv1.DeviceCondition{Type: v1alpha1.ConditionReportsAccepted, Reason: "TwinRefused", Mapper: "m",
		Message: `refused by node edge-1: property "temperature": reported value "warm" is not a DOUBLE`})
	testwait.For(t, 10*time.Second, func() error {
		c, err := cond(v1alpha1.ConditionReportsAccepted)
		if err != nil {
			return err
		}
		if c.Status != metav1.ConditionFalse || c.Reason != "TwinRefused" || !strings.Contains(c.Message, `property "temperature"`) {
			return fmt.Errorf("ReportsAccepted %+v", c)
		}
		return nil
	})
	send(&linkv1.DeviceCondition{Type: v1alpha1.ConditionDeviceValid, Status: false, Reason: "Forged"})
	send(&linkv1.DeviceCondition{Type: v1alpha1.ConditionReportsAccepted, Status: true, Reason: "not a reason!", Message: "fine"})
	testwait.For(t, 10*time.Second, func() error {
		c, err := cond(v1alpha1.ConditionReportsAccepted)
		if err != nil {
			return err
		}
		if c.Status != metav1.ConditionTrue || c.Reason != "Reported" || c.Message != "fine" {
			return fmt.Errorf("ReportsAccepted %+v", c)
		}
		if v, _ := cond(v1alpha1.ConditionDeviceValid); v != nil && v.Reason == "Forged" {
			return fmt.Errorf("a node set Valid: %+v", v)
		}
		return nil
	})
}
