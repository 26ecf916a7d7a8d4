package dowsectl

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"text/template"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
	"github.com/dowse-dev/dowse/shared/twinvalue"
)

func TestParseTargets(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // "kinds: names" per target, or the error's words
	}{
		{[]string{"devices"}, "[devices []]"},
		{[]string{"ddev", "a", "b"}, "[devices [a b]]"},
		{[]string{"Device.dowse.dev", "a"}, "[devices [a]]"},
		{[]string{"dcfg,dins"}, "[configurations []] [instances []]"},
		{[]string{"dowse"}, "[configurations []] [instances []] [devicemodels []] [devices []]"},
		{[]string{"device/a", "instance/b", "dev/c"}, "[devices [a c]] [instances [b]]"},
		{[]string{"gadgets"}, `"gadgets" is not a Dowse resource type`},
		{[]string{"device/a", "b"}, `"b": when one argument is TYPE/NAME, all must be`},
		{[]string{"dowse", "a"}, "names need one resource type"},
		{nil, "name a resource type"},
	} {
		ts, err := parseTargets(tc.args)
		got := ""
		for _, tg := range ts {
			got += fmt.Sprintf("[%s %v] ", tg.res.Plural, tg.names)
		}
		got = strings.TrimSpace(got)
		if err != nil {
			got = err.Error()
			if !errors.Is(err, ErrUsage) {
				t.Errorf("%v: %v is not a usage error", tc.args, err)
			}
		}
		if !strings.Contains(got, tc.want) {
			t.Errorf("%v: %q, want %q", tc.args, got, tc.want)
		}
	}
}

func device(props []v1alpha1.DeviceProperty, twins []v1alpha1.Twin, conds ...metav1.Condition) *v1alpha1.Device {
	d := &v1alpha1.Device{ObjectMeta: metav1.ObjectMeta{Name: "d", Namespace: "ns", Generation: 3}}
	d.Spec.Properties = props
	d.Status.Twins = twins
	d.Status.Conditions = conds
	d.Status.ObservedGeneration = 3
	return d
}

func val(v string, md ...string) *v1alpha1.TwinProperty {
	p := &v1alpha1.TwinProperty{Value: v, Metadata: map[string]string{}}
	for i := 0; i+1 < len(md); i += 2 {
		p.Metadata[md[i]] = md[i+1]
	}
	return p
}

func TestApplied(t *testing.T) {
	desired := []v1alpha1.DeviceProperty{{Name: "sp", Desired: val("21")}}
	for _, tc := range []struct {
		name    string
		d       *v1alpha1.Device
		gen     int64
		done    bool
		refused string
	}{
		{"applied", device(desired, []v1alpha1.Twin{{PropertyName: "sp", Reported: val("21.0"), ObservedDesired: val("21")}}), 3, true, ""},
		{"status of an older spec", device(desired, []v1alpha1.Twin{{PropertyName: "sp", ObservedDesired: val("21")}}), 4, false, ""},
		{"not yet", device(desired, []v1alpha1.Twin{{PropertyName: "sp", Reported: val("20"), ObservedDesired: val("20")}}), 3, false, ""},
		{"refused", device(desired, []v1alpha1.Twin{{PropertyName: "sp", Reported: val("20", twinvalue.MetaDesiredError, `desired value "21": read-only`)}}), 3, false, "refused by the mapper: desired value \"21\": read-only"},
		{"an older value's refusal", device(desired, []v1alpha1.Twin{{PropertyName: "sp", Reported: val("20", twinvalue.MetaDesiredError, `desired value "99": read-only`)}}), 3, false, ""},
		{"a mapper's own words", device(desired, []v1alpha1.Twin{{PropertyName: "sp", Reported: val("20", twinvalue.MetaDesiredError, "write failed")}}), 3, false, "refused by the mapper: write failed"},
		{"invalid", device(desired, nil, metav1.Condition{Type: v1alpha1.ConditionDeviceValid, Status: metav1.ConditionFalse, Message: "unknown property", ObservedGeneration: 3}), 3, false, "refused by the controller: unknown property"},
	} {
		done, _, err := Applied(tc.d, "sp", "21", tc.gen)
		if done != tc.done || (err == nil) != (tc.refused == "") || (err != nil && (!strings.Contains(err.Error(), tc.refused) || !errors.Is(err, ErrRefused))) {
			t.Errorf("%s: done %v err %v, want done %v refused %q", tc.name, done, err, tc.done, tc.refused)
		}
	}
}

func TestChangesAndTwin(t *testing.T) {
	ts := fmt.Sprint(time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC).UnixMilli())
	d := device([]v1alpha1.DeviceProperty{{Name: "sp", Desired: val("21")}, {Name: "temp"}},
		[]v1alpha1.Twin{{PropertyName: "sp", Reported: val("21", "timestamp", ts), ObservedDesired: val("21")}, {PropertyName: "temp", Reported: val("19.5", twinvalue.MetaError, "timeout")}, {PropertyName: "extra", Reported: val("1")}})
	d.Status.State = "ok"
	last := map[string]string{}
	var got []string
	for _, c := range Changes(d, last, time.Now()) {
		got = append(got, c.String())
	}
	want := []string{"state=ok", "sp.desired=21", "sp.reported=21", "sp.observedDesired=21", "temp.reported=19.5", "extra.reported=1"}
	if !slices.Equal(got, want) {
		t.Errorf("changes %q, want %q", got, want)
	}
	if again := Changes(d, last, time.Now()); len(again) != 0 {
		t.Errorf("unchanged device gave %v", again)
	}
	tw := TwinOf(d)
	if len(tw.Properties) != 3 || tw.Properties[2].Name != "extra" || tw.Properties[1].Error != "timeout" ||
		tw.Properties[0].ReportedAt == nil || tw.Properties[0].ReportedAt.Format(time.RFC3339) != "2026-12-01T10:00:00Z" {
		t.Errorf("twin %+v", tw)
	}
	var b bytes.Buffer
	if err := printTwinTable(&b, d, time.Now(), true); err != nil || !strings.Contains(b.String(), "timeout") || !strings.Contains(b.String(), "DESIRED ERROR") {
		t.Errorf("wide twin table:\n%s", b.String())
	}
}

// TestKrewManifest renders deploy/krew/dowse.yaml as krew-release-bot
// would and checks that krew could install from it.
func TestKrewManifest(t *testing.T) {
	text, err := os.ReadFile("../deploy/krew/dowse.yaml")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("archive"))
	tmpl, err := template.New("krew").Funcs(template.FuncMap{"addURIAndSha": func(url, tag string) string {
		return fmt.Sprintf("uri: %s\n      sha256: %s", strings.ReplaceAll(url, "{{ .TagName }}", tag), hex.EncodeToString(sum[:]))
	}}).Parse(string(text))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := tmpl.Execute(&out, map[string]string{"TagName": "v1.2.3"}); err != nil {
		t.Fatal(err)
	}
	var m struct {
		APIVersion, Kind string
		Metadata         struct{ Name string }
		Spec             struct {
			Version, Homepage, ShortDescription, Description string
			Platforms                                        []struct {
				Selector         struct{ MatchLabels map[string]string }
				URI, Sha256, Bin string
				Files            []struct{ From, To string }
			}
		}
	}
	if err := yaml.UnmarshalStrict(out.Bytes(), &m); err != nil {
		t.Fatalf("rendered manifest: %v\n%s", err, out.String())
	}
	if m.Kind != "Plugin" || m.Metadata.Name != "dowse" || m.Spec.Version != "v1.2.3" || len(m.Spec.Platforms) != 4 {
		t.Fatalf("manifest %+v", m)
	}
	for _, p := range m.Spec.Platforms {
		os, arch := p.Selector.MatchLabels["os"], p.Selector.MatchLabels["arch"]
		if p.Bin != PluginName || !strings.HasSuffix(p.URI, "/v1.2.3/kubectl-dowse_"+os+"_"+arch+".tar.gz") || len(p.Sha256) != 64 || len(p.Files) != 2 {
			t.Errorf("platform %+v", p)
		}
	}
}
