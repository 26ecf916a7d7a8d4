package opcua

import (
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	discoveryv1 "github.com/dowse-dev/dowse/proto/discovery/v1"
)

func TestParseDetails(t *testing.T) {
	for _, tc := range []struct {
		name    string
		details string
		check   func(*testing.T, *Details)
		wantErr string // part of the InvalidArgument message; "" for success
	}{
		{name: "defaults", details: ``, check: func(t *testing.T, d *Details) {
			if len(d.DiscoveryURLs) != 1 || d.DiscoveryURLs[0] != DefaultDiscoveryURL || d.Interval() != DefaultRediscoveryInterval ||
				d.CallTimeout() != DefaultTimeout || d.FailureThreshold != DefaultFailureThreshold || d.ApplicationNames != nil {
				t.Errorf("defaults = %+v", d)
			}
		}},
		{name: "JSON", details: `{"discoveryUrls": ["opc.tcp://a:4840/", "opc.tcp://b:4841"], "applicationNames": {"action": "Include", "items": ["x"]}, "rediscoveryInterval": "2s", "timeout": "300ms", "failureThreshold": 5}`,
			check: func(t *testing.T, d *Details) {
				if len(d.DiscoveryURLs) != 2 || d.Interval() != 2*time.Second || d.CallTimeout() != 300*time.Millisecond || d.FailureThreshold != 5 ||
					!d.ApplicationNames.Accepts("x") || d.ApplicationNames.Accepts("y") {
					t.Errorf("parsed = %+v", d)
				}
			}},
		{name: "YAML, Exclude by default", details: "applicationNames:\n  items: [x]\n", check: func(t *testing.T, d *Details) {
			if d.ApplicationNames.Action != Exclude || d.ApplicationNames.Accepts("x") || !d.ApplicationNames.Accepts("y") {
				t.Errorf("filter = %+v", d.ApplicationNames)
			}
		}},
		{name: "unknown field", details: `{"discoveryUrl": "opc.tcp://a:4840"}`, wantErr: `"discoveryUrl"`},
		{name: "unknown nested field", details: `{"applicationNames": {"action": "Include", "names": ["x"]}}`, wantErr: `"names"`},
		{name: "bad YAML", details: `discoveryUrls: [`, wantErr: "discovery_details"},
		{name: "wrong type", details: `discoveryUrls: opc.tcp://a:4840`, wantErr: "discovery_details"},
		{name: "bad scheme", details: `discoveryUrls: ["http://a:4840"]`, wantErr: "discoveryUrls[0]"},
		{name: "no host", details: `discoveryUrls: ["opc.tcp://a:1", "opc.tcp:///x"]`, wantErr: "discoveryUrls[1]"},
		{name: "duplicate URL", details: `discoveryUrls: ["opc.tcp://a:1", "opc.tcp://a:1"]`, wantErr: "discoveryUrls[1]: \"opc.tcp://a:1\" duplicates discoveryUrls[0]"},
		{name: "too many URLs", details: `discoveryUrls: [` + strings.Repeat(`"opc.tcp://a:1",`, MaxDiscoveryURLs) + `"opc.tcp://b:1"]`, wantErr: "discoveryUrls: 65 URLs"},
		{name: "bad action", details: `applicationNames: {action: Only, items: [x]}`, wantErr: "applicationNames.action"},
		{name: "empty item", details: `applicationNames: {items: [x, ""]}`, wantErr: "applicationNames.items[1]"},
		{name: "bad interval", details: `rediscoveryInterval: soon`, wantErr: "rediscoveryInterval"},
		{name: "interval too short", details: `rediscoveryInterval: 1ms`, wantErr: "rediscoveryInterval: 1ms is shorter"},
		{name: "bad timeout", details: `timeout: "-1s"`, wantErr: "timeout"},
		{name: "bad threshold", details: `failureThreshold: -2`, wantErr: "failureThreshold"},
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
			tc.check(t, d)
		})
	}
}

func TestParseCredentials(t *testing.T) {
	for name, tc := range map[string]struct {
		props   map[string]*discoveryv1.ByteData
		wantErr string
	}{
		"none":       {},
		"cert only":  {props: map[string]*discoveryv1.ByteData{ClientCertificateProperty: {Vec: []byte("x")}}, wantErr: ClientKeyProperty + " is not"},
		"key only":   {props: map[string]*discoveryv1.ByteData{ClientKeyProperty: {Vec: []byte("x")}}, wantErr: ClientCertificateProperty + " is not"},
		"not PEM":    {props: map[string]*discoveryv1.ByteData{ClientCertificateProperty: {Vec: []byte("x")}, ClientKeyProperty: {Vec: []byte("y")}}, wantErr: ClientCertificateProperty + "/" + ClientKeyProperty},
		"unresolved": {props: map[string]*discoveryv1.ByteData{ClientCertificateProperty: {}, ClientKeyProperty: {}}},
	} {
		t.Run(name, func(t *testing.T) {
			c, err := parseCredentials(tc.props)
			if tc.wantErr == "" {
				if err != nil || c != nil {
					t.Fatalf("parseCredentials = %v, %v; want nil, nil", c, err)
				}
				return
			}
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("parseCredentials = %v, want InvalidArgument containing %q", err, tc.wantErr)
			}
		})
	}
}
