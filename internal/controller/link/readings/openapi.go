package readings

// The API's OpenAPI documents, v2 at /openapi/v2 and v3 at /openapi/v3
// (discovery) and /openapi/v3/apis/readings.dowse.dev/v1alpha1, built
// from the definitions openapi-gen generates from the Go types (package
// openapi). The API server's aggregator merges them into its own, so
// that kubectl explain knows DeviceReadings and their fields.

import (
	"crypto/sha512"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"

	openapiv2 "github.com/google/gnostic-models/openapiv2"
	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kube-openapi/pkg/common"
	"k8s.io/kube-openapi/pkg/handler3"
	"k8s.io/kube-openapi/pkg/spec3"
	"k8s.io/kube-openapi/pkg/util"
	"k8s.io/kube-openapi/pkg/validation/spec"

	"github.com/dowse-dev/dowse/internal/controller/link/readings/openapi"
	rv1 "github.com/dowse-dev/dowse/shared/api/readings/v1alpha1"
)

const typesPkg = "github.com/dowse-dev/dowse/shared/api/readings/v1alpha1."

// definitionName is a Go type's name in the documents: the API server's
// (io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta, the meta types'
// model names, so the aggregator finds them the same as its own), and the group reversed for
// the API's kinds (dev.dowse.readings.v1alpha1.DeviceReading), as the
// generic API server names a group's kinds.
func definitionName(goName string) string {
	if t, ok := strings.CutPrefix(goName, typesPkg); ok {
		parts := strings.Split(rv1.Group, ".")
		slices.Reverse(parts)
		return strings.Join(parts, ".") + "." + rv1.Version + "." + t
	}
	if !strings.Contains(goName, "/") {
		return goName // a model name already (the meta types')
	}
	return util.ToRESTFriendlyName(goName)
}

// definitions are the schemas the API's kinds need (theirs and the meta
// ones they refer to), named by definitionName, with refs under prefix
// (#/definitions/ in v2, #/components/schemas/ in v3).
func definitions(prefix string) map[string]*spec.Schema {
	defs := openapi.GetOpenAPIDefinitions(func(p string) spec.Ref {
		return spec.MustCreateRef(prefix + common.EscapeJsonPointer(definitionName(p)))
	})
	out := map[string]*spec.Schema{}
	var add func(goName string)
	add = func(goName string) {
		name := definitionName(goName)
		if _, ok := out[name]; ok {
			return
		}
		d, ok := defs[goName]
		if !ok {
			panic("readings: no OpenAPI definition of " + goName + ": run make generate")
		}
		s := d.Schema
		out[name] = &s
		for _, dep := range d.Dependencies {
			add(dep)
		}
	}
	for _, kind := range []string{rv1.Kind, rv1.ListKind} {
		add(typesPkg + kind)
		s := out[definitionName(typesPkg+kind)]
		s.AddExtension("x-kubernetes-group-version-kind", []any{map[string]any{
			"group": rv1.Group, "version": rv1.Version, "kind": kind}})
	}
	add(metav1.Status{}.OpenAPIModelName())
	add(metav1.WatchEvent{}.OpenAPIModelName())
	return out
}

// operation is one of the API's operations, in either document.
type operation struct {
	path, id, action, description string
	kind                          string // the 200 answer's kind
	params                        []string
}

var (
	basePath   = "/apis/" + rv1.Group + "/" + rv1.Version
	listParams = []string{"labelSelector", "fieldSelector", "resourceVersion", "resourceVersionMatch", "timeoutSeconds",
		"watch", "allowWatchBookmarks", "sendInitialEvents"}
	paramDoc = map[string]string{
		"namespace":            "object name and auth scope, such as for teams and projects",
		"name":                 "name of the DeviceReading (its Device's)",
		"labelSelector":        "A selector on the Devices' labels.",
		"fieldSelector":        "metadata.name and metadata.namespace equality only.",
		"resourceVersion":      "A list answers the newest readings whatever it is. A watch from a resourceVersion first sends every reading newer than it (410 Gone when this replica cannot answer for it), then the changes.",
		"resourceVersionMatch": "Accepted; every answer is the newest.",
		"timeoutSeconds":       "Ends a watch after this many seconds.",
		"watch":                "Watch for changes: a stream of watch events.",
		"allowWatchBookmarks":  "The watch sends BOOKMARK events as time passes.",
		"sendInitialEvents":    "The watch starts with every matching reading, then a BOOKMARK annotated k8s.io/initial-events-end.",
	}
	gvkExt = func(kind string) map[string]any {
		return map[string]any{"group": rv1.Group, "version": rv1.Version, "kind": kind}
	}
)

func operations() []operation {
	return []operation{
		{path: basePath + "/" + rv1.Resource, id: "listReadingsDowseDevV1alpha1DeviceReadingForAllNamespaces", action: "list",
			description: "list or watch the DeviceReadings of every namespace", kind: rv1.ListKind, params: listParams},
		{path: basePath + "/namespaces/{namespace}/" + rv1.Resource, id: "listReadingsDowseDevV1alpha1NamespacedDeviceReading", action: "list",
			description: "list or watch the DeviceReadings of a namespace", kind: rv1.ListKind, params: append([]string{"namespace"}, listParams...)},
		{path: basePath + "/namespaces/{namespace}/" + rv1.Resource + "/{name}", id: "readReadingsDowseDevV1alpha1NamespacedDeviceReading", action: "get",
			description: "read the specified DeviceReading", kind: rv1.Kind, params: []string{"namespace", "name"}},
	}
}

func paramIn(p string) string {
	if p == "namespace" || p == "name" {
		return "path"
	}
	return "query"
}

// swagger is the OpenAPI v2 document.
func swagger() *spec.Swagger {
	defs := definitions("#/definitions/")
	sw := &spec.Swagger{SwaggerProps: spec.SwaggerProps{Swagger: "2.0",
		Info:        &spec.Info{InfoProps: spec.InfoProps{Title: "Dowse live readings", Version: rv1.Version}},
		Paths:       &spec.Paths{Paths: map[string]spec.PathItem{}},
		Definitions: spec.Definitions{}}}
	for name, s := range defs {
		sw.Definitions[name] = *s
	}
	for _, op := range operations() {
		o := &spec.Operation{OperationProps: spec.OperationProps{ID: op.id, Description: op.description,
			Tags: []string{"readingsDowseDev_v1alpha1"}, Schemes: []string{"https"},
			Consumes: []string{"*/*"}, Produces: []string{"application/json", "application/json;stream=watch"},
			Responses: &spec.Responses{ResponsesProps: spec.ResponsesProps{StatusCodeResponses: map[int]spec.Response{
				http.StatusOK:           {ResponseProps: spec.ResponseProps{Description: "OK", Schema: spec.RefSchema("#/definitions/" + definitionName(typesPkg+op.kind))}},
				http.StatusUnauthorized: {ResponseProps: spec.ResponseProps{Description: "Unauthorized"}},
			}}}}}
		o.AddExtension("x-kubernetes-action", op.action)
		o.AddExtension("x-kubernetes-group-version-kind", gvkExt(rv1.Kind))
		for _, p := range op.params {
			typ := paramTypeOf(p)
			sp := spec.Parameter{ParamProps: spec.ParamProps{Name: p, In: paramIn(p), Description: paramDoc[p],
				Required: paramIn(p) == "path"}, SimpleSchema: spec.SimpleSchema{Type: typ}}
			sp.UniqueItems = true
			o.Parameters = append(o.Parameters, sp)
		}
		sw.Paths.Paths[op.path] = spec.PathItem{PathItemProps: spec.PathItemProps{Get: o}}
	}
	return sw
}

// openAPIV3 is the group version's OpenAPI v3 document.
func openAPIV3() *spec3.OpenAPI {
	doc := &spec3.OpenAPI{Version: "3.0.0",
		Info:       &spec.Info{InfoProps: spec.InfoProps{Title: "Dowse live readings", Version: rv1.Version}},
		Paths:      &spec3.Paths{Paths: map[string]*spec3.Path{}},
		Components: &spec3.Components{Schemas: definitions("#/components/schemas/")}}
	for _, op := range operations() {
		schema := spec.RefSchema("#/components/schemas/" + definitionName(typesPkg+op.kind))
		o := &spec3.Operation{OperationProps: spec3.OperationProps{OperationId: op.id, Description: op.description,
			Tags: []string{"readingsDowseDev_v1alpha1"},
			Responses: &spec3.Responses{ResponsesProps: spec3.ResponsesProps{StatusCodeResponses: map[int]*spec3.Response{
				http.StatusOK: {ResponseProps: spec3.ResponseProps{Description: "OK", Content: map[string]*spec3.MediaType{
					"application/json":              {MediaTypeProps: spec3.MediaTypeProps{Schema: schema}},
					"application/json;stream=watch": {MediaTypeProps: spec3.MediaTypeProps{Schema: schema}},
				}}},
				http.StatusUnauthorized: {ResponseProps: spec3.ResponseProps{Description: "Unauthorized"}},
			}}}}}
		o.AddExtension("x-kubernetes-action", op.action)
		o.AddExtension("x-kubernetes-group-version-kind", gvkExt(rv1.Kind))
		for _, p := range op.params {
			typ := paramTypeOf(p)
			o.Parameters = append(o.Parameters, &spec3.Parameter{ParameterProps: spec3.ParameterProps{Name: p, In: paramIn(p),
				Description: paramDoc[p], Required: paramIn(p) == "path",
				Schema: &spec.Schema{SchemaProps: spec.SchemaProps{Type: spec.StringOrArray{typ}}}}})
		}
		doc.Paths.Paths[op.path] = &spec3.Path{PathProps: spec3.PathProps{Get: o}}
	}
	return doc
}

// openAPIHandler serves both documents: v2 as JSON or protobuf (as the
// aggregator and kubectl ask), with an ETag; v3 through kube-openapi's
// handler (discovery, each group version by hash, JSON or protobuf).
type openAPIHandler struct {
	v2JSON, v2Proto []byte
	v2ETag          string
	v3              http.Handler
}

func newOpenAPIHandler() (*openAPIHandler, error) {
	j, err := json.Marshal(swagger())
	if err != nil {
		return nil, err
	}
	doc, err := openapiv2.ParseDocument(j)
	if err != nil {
		return nil, fmt.Errorf("readings: the OpenAPI v2 document does not parse: %w", err)
	}
	pb, err := proto.Marshal(doc)
	if err != nil {
		return nil, err
	}
	v3 := handler3.NewOpenAPIService()
	v3.UpdateGroupVersion("apis/"+rv1.Group+"/"+rv1.Version, openAPIV3())
	mux := http.NewServeMux()
	if err := v3.RegisterOpenAPIV3VersionedService("/openapi/v3", prefixMux{mux}); err != nil {
		return nil, err
	}
	return &openAPIHandler{v2JSON: j, v2Proto: pb, v2ETag: fmt.Sprintf(`"%X"`, sha512.Sum512(j)), v3: mux}, nil
}

type prefixMux struct{ *http.ServeMux }

func (m prefixMux) HandlePrefix(p string, h http.Handler) { m.Handle(p, h) }

func (h *openAPIHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if strings.HasPrefix(r.URL.Path, "/openapi/v3") {
		h.v3.ServeHTTP(w, r)
		return
	}
	if r.URL.Path != "/openapi/v2" {
		http.NotFound(w, r)
		return
	}
	body, ctype := h.v2JSON, "application/json"
	if strings.Contains(r.Header.Get("Accept"), "protobuf") {
		body, ctype = h.v2Proto, "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"
	}
	w.Header().Set("Etag", h.v2ETag)
	w.Header().Set("Vary", "Accept")
	if r.Header.Get("If-None-Match") == h.v2ETag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Header().Set("Content-Type", ctype)
	_, _ = w.Write(body)
}

// paramTypeOf is a query or path parameter's OpenAPI type.
func paramTypeOf(p string) string {
	switch p {
	case "timeoutSeconds":
		return "integer"
	case "watch", "allowWatchBookmarks", "sendInitialEvents":
		return "boolean"
	}
	return "string"
}
