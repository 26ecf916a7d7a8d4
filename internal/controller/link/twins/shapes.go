package twins

// What the cloud takes of a node's reported value: the node is not
// trusted to have checked it against the model (its agent does; a node
// that lies does not), so a property the model lacks, a value not of its
// type or too large is dropped, metadata is capped and times are clamped,
// and a node cannot grow its Devices towards etcd's object limit.

import (
	"fmt"
	"maps"
	"slices"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	linkv1 "github.com/dowse-dev/dowse/proto/link/v1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

// Bounds of what a node's report may put in Device.status; the CRD's
// schema says the same (MaxLength, MaxProperties) so that the API server
// refuses what slips past.
const (
	maxReportedValue = 16 << 10
	maxMetadataKeys  = 16
	maxMetadataKey   = 63
	maxMetadataValue = 256
	// futureSkew is how far ahead of the cloud's clock a report's time
	// may be before the cloud's receive time replaces it.
	futureSkew = time.Minute
)

// Reasons a reported value is dropped (metrics and condition reasons).
const (
	refusedUnknownProperty = "unknown-property"
	refusedBadValue        = "bad-value"
	refusedTooLarge        = "too-large"
)

// checkedReport is a node's reported value as the cloud takes it.
type checkedReport struct {
	reported, observed *v1alpha1.TwinProperty
	at                 time.Time
	// refused is why the value was dropped ("" when taken), and message
	// the words for the Device's ReportsChecked condition.
	refused, message string
	// trimmed counts metadata entries dropped and times clamped.
	trimmed int
}

// checkReport checks r against the model property of its name. now is the
// cloud's receive time. A time ahead of it (beyond futureSkew) becomes now:
// a node's clock must not pin LastReportTime in the future, where no later
// report could move it; a time in the past moves nothing backwards.
func checkReport(model *v1alpha1.DeviceModel, r *linkv1.TwinReportedUpdate, node string, now time.Time) checkedReport {
	var c checkedReport
	prop := slices.IndexFunc(model.Spec.Properties, func(p v1alpha1.ModelProperty) bool { return p.Name == r.GetProperty() })
	if prop < 0 {
		c.refused, c.message = refusedUnknownProperty, fmt.Sprintf("node %s reported property %.128q, which DeviceModel %s does not have", node, r.GetProperty(), model.Name)
		return c
	}
	typ := twinvalue.Type(model.Spec.Properties[prop].Type)
	value := r.GetReported().GetValue()
	if len(value) > maxReportedValue {
		c.refused, c.message = refusedTooLarge, fmt.Sprintf("node %s reported a value of %d bytes for property %s (at most %d)", node, len(value), r.GetProperty(), maxReportedValue)
		return c
	}
	if _, err := twinvalue.Parse(typ, value); err != nil {
		c.refused, c.message = refusedBadValue, fmt.Sprintf("node %s reported property %s: %v", node, r.GetProperty(), truncated(err.Error()))
		return c
	}

	c.at = now
	if t := r.GetTime(); t != nil {
		c.at = t.AsTime()
	}
	// A time ahead of the cloud's clock, or not after the epoch (which no
	// timestamp in metadata can say), is the receive time.
	if c.at.After(now.Add(futureSkew)) || c.at.UnixMilli() <= 0 {
		c.at = now
		c.trimmed++
	}
	md, dropped := cappedMetadata(r.GetReported().GetMetadata())
	c.trimmed += dropped
	if ts, ok := twinvalue.TimestampOf(md); !ok || ts.After(now.Add(futureSkew)) {
		md[twinvalue.MetaTimestamp] = twinvalue.Timestamp(c.at)
	}
	c.reported = &v1alpha1.TwinProperty{Value: value, Metadata: md}
	if od := r.GetObservedDesired(); od != nil {
		// An observed desired value that is not of the type is dropped
		// alone: the reading itself is good.
		if _, err := twinvalue.Parse(typ, od.GetValue()); err == nil && len(od.GetValue()) <= maxReportedValue {
			c.observed = &v1alpha1.TwinProperty{Value: od.GetValue(), Metadata: map[string]string{twinvalue.MetaTimestamp: md[twinvalue.MetaTimestamp]}}
		} else {
			c.trimmed++
		}
	}
	return c
}

// cappedMetadata is md without entries beyond the bounds: keys too long,
// values too long, and past maxMetadataKeys less the timestamp's own
// place (in key order, so that the same report keeps the same entries).
func cappedMetadata(md map[string]string) (map[string]string, int) {
	out := make(map[string]string, min(len(md), maxMetadataKeys))
	dropped, others := 0, 0
	if ts, ok := md[twinvalue.MetaTimestamp]; ok && len(ts) <= maxMetadataValue {
		out[twinvalue.MetaTimestamp] = ts
	}
	for _, k := range slices.Sorted(maps.Keys(md)) {
		v := md[k]
		if k == twinvalue.MetaTimestamp {
			if _, kept := out[k]; !kept {
				dropped++
			}
			continue
		}
		if k == "" || len(k) > maxMetadataKey || len(v) > maxMetadataValue || others >= maxMetadataKeys-1 {
			dropped++
			continue
		}
		out[k] = v
		others++
	}
	return out, dropped
}

// refusalCondition is the ReportsChecked condition for a dropped report.
func refusalCondition(c checkedReport, generation int64) metav1.Condition {
	reason := map[string]string{refusedUnknownProperty: "UnknownProperty", refusedBadValue: "BadValue", refusedTooLarge: "TooLarge"}[c.refused]
	return metav1.Condition{Type: v1alpha1.ConditionReportsChecked, Status: metav1.ConditionFalse, Reason: reason,
		Message: c.message + "; dropped by the cloud", ObservedGeneration: generation}
}

func truncated(s string) string {
	if len(s) > 512 {
		return s[:512] + "…"
	}
	return s
}
