package readings

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	openapiv2 "github.com/google/gnostic-models/openapiv2"
	"google.golang.org/protobuf/proto"

	rv1 "github.com/dowse-dev/dowse/shared/api/readings/v1alpha1"
)

// refsOf collects every $ref in a JSON document.
func refsOf(v any, out map[string]bool) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if s, ok := e.(string); ok && k == "$ref" {
				out[s] = true
			}
			refsOf(e, out)
		}
	case []any:
		for _, e := range x {
			refsOf(e, out)
		}
	}
}

func fetchJSON(t *testing.T, h http.Handler, path, accept string) (map[string]any, *http.Response, []byte) {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	resp := rec.Result()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", path, resp.Status)
	}
	b, _ := io.ReadAll(resp.Body)
	var doc map[string]any
	if strings.Contains(accept, "protobuf") {
		return nil, resp, b
	}
	if err := json.Unmarshal(b, &doc); err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	return doc, resp, b
}

// The documents describe both kinds with their fields and the group
// version kind kubectl looks them up by, and every reference in them
// resolves.
func TestOpenAPIDocuments(t *testing.T) {
	h, err := newOpenAPIHandler()
	if err != nil {
		t.Fatal(err)
	}
	const reading = "dev.dowse.readings.v1alpha1.DeviceReading"
	check := func(doc map[string]any, defs map[string]any, prefix string) {
		t.Helper()
		for _, name := range []string{reading, reading + "List"} {
			d, ok := defs[name].(map[string]any)
			if !ok {
				t.Fatalf("no definition %s among %d", name, len(defs))
			}
			gvk, _ := json.Marshal(d["x-kubernetes-group-version-kind"])
			if !strings.Contains(string(gvk), `"group":"`+rv1.Group+`"`) {
				t.Errorf("%s: x-kubernetes-group-version-kind %s", name, gvk)
			}
		}
		props := defs[reading].(map[string]any)["properties"].(map[string]any)
		for _, f := range []string{"metadata", "node", "replica", "state", "properties"} {
			if props[f] == nil {
				t.Errorf("DeviceReading has no field %s", f)
			}
		}
		if d := props["properties"].(map[string]any)["description"]; d == nil || !strings.Contains(d.(string), "reported properties") {
			t.Errorf("properties' description: %v", d)
		}
		refs := map[string]bool{}
		refsOf(doc, refs)
		if len(refs) == 0 {
			t.Fatal("no references")
		}
		for r := range refs {
			name, ok := strings.CutPrefix(r, prefix)
			if !ok || defs[name] == nil {
				t.Errorf("reference %s does not resolve", r)
			}
		}
	}
	v2, resp, _ := fetchJSON(t, h, "/openapi/v2", "application/json")
	check(v2, v2["definitions"].(map[string]any), "#/definitions/")
	if _, ok := v2["paths"].(map[string]any)["/apis/readings.dowse.dev/v1alpha1/namespaces/{namespace}/devicereadings/{name}"]; !ok {
		t.Errorf("v2 paths: %v", v2["paths"])
	}
	list := v2["paths"].(map[string]any)["/apis/readings.dowse.dev/v1alpha1/namespaces/{namespace}/devicereadings"].(map[string]any)
	types := map[string]any{}
	for _, p := range list["get"].(map[string]any)["parameters"].([]any) {
		types[p.(map[string]any)["name"].(string)] = p.(map[string]any)["type"]
	}
	if types["timeoutSeconds"] != "integer" || types["watch"] != "boolean" || types["labelSelector"] != "string" {
		t.Errorf("v2 list parameters' types: %v", types)
	}
	etag := resp.Header.Get("Etag")
	req := httptest.NewRequest(http.MethodGet, "/openapi/v2", nil)
	req.Header.Set("If-None-Match", etag)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if etag == "" || rec.Code != http.StatusNotModified {
		t.Errorf("ETag %q, then %d", etag, rec.Code)
	}
	_, _, b := fetchJSON(t, h, "/openapi/v2", "application/com.github.proto-openapi.spec.v2@v1.0+protobuf")
	var pb openapiv2.Document
	if err := proto.Unmarshal(b, &pb); err != nil || len(pb.GetDefinitions().GetAdditionalProperties()) == 0 {
		t.Errorf("protobuf v2: %v, %d definitions", err, len(pb.GetDefinitions().GetAdditionalProperties()))
	}

	disc, _, _ := fetchJSON(t, h, "/openapi/v3", "application/json")
	gv, ok := disc["paths"].(map[string]any)["apis/readings.dowse.dev/v1alpha1"].(map[string]any)
	if !ok {
		t.Fatalf("v3 discovery: %v", disc)
	}
	url := gv["serverRelativeURL"].(string)
	if !strings.HasPrefix(url, "/openapi/v3/apis/readings.dowse.dev/v1alpha1?hash=") {
		t.Fatalf("v3 discovery's URL %s", url)
	}
	v3, _, _ := fetchJSON(t, h, url, "application/json")
	check(v3, v3["components"].(map[string]any)["schemas"].(map[string]any), "#/components/schemas/")
}
