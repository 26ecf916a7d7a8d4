package readings

// DeviceReadings as clients see them: what a replica holds (live), laid
// over what Device.status holds (the durable record), and their Table
// form for kubectl.

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	rv1 "github.com/dowse-dev/dowse/shared/api/readings/v1alpha1"
	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

var typeMeta = metav1.TypeMeta{APIVersion: rv1.GroupVersion.String(), Kind: rv1.Kind}

// liveReading is a snapshot as a DeviceReading holding live values only
// (what one replica answers another).
func liveReading(s Snapshot, replica string) rv1.DeviceReading {
	r := rv1.DeviceReading{TypeMeta: typeMeta,
		ObjectMeta: metav1.ObjectMeta{Namespace: s.Key.Namespace, Name: s.Key.Name},
		Node:       s.Node, Replica: replica, State: s.State}
	if !s.Taken.IsZero() {
		r.Annotations = map[string]string{takenAnnotation: strconv.FormatInt(s.Taken.UnixMicro(), 10)}
	}
	for _, p := range s.Props {
		pr := rv1.PropertyReading{Name: p.Name, Value: p.Value, Time: metav1.NewMicroTime(p.At), Source: rv1.SourceLive}
		for _, h := range p.History {
			pr.History = append(pr.History, rv1.Sample{Value: h.Value, Time: metav1.NewMicroTime(h.At)})
		}
		r.Properties = append(r.Properties, pr)
	}
	return r
}

// merged is d's reading: its status's reported values, each replaced by
// live's when that is as new or newer. live may be nil.
func merged(d *v1alpha1.Device, live *rv1.DeviceReading) rv1.DeviceReading {
	r := rv1.DeviceReading{TypeMeta: typeMeta,
		ObjectMeta: metav1.ObjectMeta{Namespace: d.Namespace, Name: d.Name, UID: d.UID,
			Labels: d.Labels, CreationTimestamp: d.CreationTimestamp},
		Node: d.Spec.NodeName, State: d.Status.State}
	byName := map[string]int{}
	for _, t := range d.Status.Twins {
		if t.Reported == nil {
			continue
		}
		var at time.Time
		if ts, ok := twinvalue.TimestampOf(t.Reported.Metadata); ok {
			at = ts
		} else if d.Status.LastReportTime != nil {
			at = d.Status.LastReportTime.Time
		}
		byName[t.PropertyName] = len(r.Properties)
		r.Properties = append(r.Properties, rv1.PropertyReading{Name: t.PropertyName, Value: t.Reported.Value,
			Time: metav1.NewMicroTime(at), Source: rv1.SourceStatus})
	}
	if live != nil {
		r.Replica = live.Replica
		if live.State != "" {
			r.State = live.State
		}
		for _, p := range live.Properties {
			i, ok := byName[p.Name]
			switch {
			case !ok:
				r.Properties = append(r.Properties, p)
			case !p.Time.Before(&r.Properties[i].Time):
				r.Properties[i] = p
			}
		}
	}
	sort.Slice(r.Properties, func(i, j int) bool { return r.Properties[i].Name < r.Properties[j].Name })
	r.ResourceVersion = versionOf(&r)
	return r
}

// takenOf is when a replica took live's newest change (0 when unknown).
func takenOf(live *rv1.DeviceReading) int64 {
	if live == nil {
		return 0
	}
	n, _ := strconv.ParseInt(live.Annotations[takenAnnotation], 10, 64)
	return n
}

// versionOf is a reading's resourceVersion: the newest read time of its
// values (Unix microseconds), which only rises for a Device, whichever
// replica serves it.
func versionOf(r *rv1.DeviceReading) string {
	t := r.Newest()
	if t.IsZero() {
		return "1"
	}
	return strconv.FormatInt(t.UnixMicro(), 10)
}

// digest identifies what a watcher was last sent of a reading.
func digest(r *rv1.DeviceReading) [32]byte {
	h := sha256.New()
	fmt.Fprintf(h, "%s\x00%s\x00%s\x00", r.State, r.Node, r.Replica)
	for _, p := range r.Properties {
		fmt.Fprintf(h, "%s\x00%s\x00%d\x00%s\x00", p.Name, p.Value, p.Time.UnixNano(), p.Source)
	}
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

// Table columns, as kubectl prints them.
var columns = []metav1.TableColumnDefinition{
	{Name: "Name", Type: "string", Format: "name", Description: "The Device's name."},
	{Name: "Node", Type: "string", Description: "The Device's node."},
	{Name: "State", Type: "string", Description: "The device's state as its mapper reported it."},
	{Name: "Values", Type: "string", Description: "The newest value of each property."},
	{Name: "Read", Type: "string", Description: "How long ago the newest value was read."},
	{Name: "Source", Type: "string", Description: "live: from the replica holding the node's session; status: from Device.status.", Priority: 1},
	{Name: "Replica", Type: "string", Description: "The controller replica holding the node's session.", Priority: 1},
}

// table is rs as a meta.k8s.io/v1 Table.
func table(rs []rv1.DeviceReading, resourceVersion string, now time.Time) (*metav1.Table, error) {
	t := &metav1.Table{TypeMeta: metav1.TypeMeta{APIVersion: "meta.k8s.io/v1", Kind: "Table"},
		ListMeta: metav1.ListMeta{ResourceVersion: resourceVersion}, ColumnDefinitions: columns, Rows: []metav1.TableRow{}}
	for i := range rs {
		row, err := tableRow(&rs[i], now)
		if err != nil {
			return nil, err
		}
		t.Rows = append(t.Rows, row)
	}
	return t, nil
}

func tableRow(r *rv1.DeviceReading, now time.Time) (metav1.TableRow, error) {
	raw, err := json.Marshal(r)
	if err != nil {
		return metav1.TableRow{}, err
	}
	var values []string
	source := rv1.SourceStatus
	for _, p := range r.Properties {
		values = append(values, p.Name+"="+p.Value)
		if p.Source == rv1.SourceLive {
			source = rv1.SourceLive
		}
	}
	v := strings.Join(values, " ")
	if len(v) > 80 {
		v = v[:77] + "..."
	}
	read := "<none>"
	if n := r.Newest(); !n.IsZero() {
		read = shortDuration(now.Sub(n.Time))
	}
	return metav1.TableRow{Cells: []any{r.Name, orNone(r.Node), orNone(r.State), orNone(v), read, source, orNone(r.Replica)},
		Object: runtime.RawExtension{Raw: raw}}, nil
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}

// shortDuration is d as kubectl's ages read (ms below a second).
func shortDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Second:
		return strconv.FormatInt(d.Milliseconds(), 10) + "ms"
	case d < 2*time.Minute:
		return strconv.FormatFloat(d.Seconds(), 'f', 1, 64) + "s"
	case d < 2*time.Hour:
		return strconv.Itoa(int(d.Minutes())) + "m"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d.Hours())) + "h"
	}
	return strconv.Itoa(int(d.Hours()/24)) + "d"
}
