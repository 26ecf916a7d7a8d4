package discovery

import (
	"encoding/json"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

// DetailsText is the discovery_details string a handler is sent for a
// Configuration's spec.discoveryHandler.discoveryDetails. Details given as
// an object (Dowse's form) are sent as their JSON, which is YAML too, so
// Akri's v0 handlers, which parse YAML, read them. Details given as one
// string (Akri's form: discoveryDetails holds the YAML text) are sent as
// that text, as Akri's agent sends them, not as a quoted JSON string.
// Absent details are "".
func DetailsText(d *apiextensionsv1.JSON) string {
	if d == nil || len(d.Raw) == 0 {
		return ""
	}
	if d.Raw[0] == '"' {
		var s string
		if err := json.Unmarshal(d.Raw, &s); err == nil {
			return s
		}
	}
	return string(d.Raw)
}
