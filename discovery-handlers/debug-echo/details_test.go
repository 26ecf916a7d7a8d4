package debugecho

import (
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestParseDetails(t *testing.T) {
	for _, tc := range []struct {
		name    string
		details string
		want    []string
		wantErr string // part of the InvalidArgument message; "" for success
	}{
		{name: "JSON", details: `{"descriptions": ["foo0", "foo1"]}`, want: []string{"foo0", "foo1"}},
		{name: "YAML", details: "descriptions:\n- foo0\n- foo1\n", want: []string{"foo0", "foo1"}},
		{name: "YAML flow", details: "descriptions: [bar]", want: []string{"bar"}},
		{name: "bad YAML", details: "descriptions: [foo0", wantErr: "discovery_details"},
		{name: "bad JSON", details: `{"descriptions": ["foo0"`, wantErr: "discovery_details"},
		{name: "unknown field", details: `{"descriptions": ["foo0"], "colour": "red"}`, wantErr: `"colour"`},
		{name: "misspelt field", details: `description: [foo0]`, wantErr: `"description"`},
		{name: "wrong type", details: `descriptions: foo0`, wantErr: "discovery_details"},
		{name: "empty details", details: ``, wantErr: "descriptions: at least one"},
		{name: "empty list", details: `{"descriptions": []}`, wantErr: "descriptions: at least one"},
		{name: "empty description", details: `{"descriptions": ["foo0", ""]}`, wantErr: "descriptions[1]"},
		{name: "blank description", details: `{"descriptions": [" "]}`, wantErr: "descriptions[0]"},
		{name: "duplicate", details: `{"descriptions": ["foo0", "foo1", "foo0"]}`, wantErr: "descriptions[2]: \"foo0\" duplicates descriptions[0]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := ParseDetails(tc.details)
			if tc.wantErr != "" {
				if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.wantErr) {
					t.Fatalf("ParseDetails(%q) = %v, want InvalidArgument containing %q", tc.details, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseDetails(%q) = %v", tc.details, err)
			}
			if !slices.Equal(d.Descriptions, tc.want) {
				t.Errorf("descriptions = %q, want %q", d.Descriptions, tc.want)
			}
		})
	}
}

func TestDevices(t *testing.T) {
	devs := (&Details{Descriptions: []string{"foo0", "foo1"}}).Devices()
	if len(devs) != 2 {
		t.Fatalf("got %d devices, want 2", len(devs))
	}
	for i, want := range []string{"foo0", "foo1"} {
		if devs[i].GetId() != want || len(devs[i].GetProperties()) != 1 || devs[i].GetProperties()[DescriptionProperty] != want {
			t.Errorf("device %d = %v, want id %q and only %s=%q", i, devs[i], want, DescriptionProperty, want)
		}
	}
}
