package nodeapi

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
)

// apiRequest is what the proxy needs to know of a request to the API server:
// which collection or object it names and, for reads, how it selects.
type apiRequest struct {
	// verb is get, list, watch, create, update, patch, delete or
	// deletecollection; "" for a path outside the resource API (/readyz,
	// /version, discovery), which is only ever passed through.
	verb string
	// groupVersion is "v1" for the core group, "GROUP/VERSION" otherwise.
	groupVersion string
	resource     string
	namespace    string
	name         string
	subresource  string
	labels       labels.Selector
	fields       fields.Selector
	// discovery is a path of what the API server serves (/api, /apis and
	// below, /version, /openapi), not of objects.
	discovery bool
	// initialEvents is a watch that asks for the current state first
	// (sendInitialEvents=true, a "watch list").
	initialEvents bool
}

// collection names the store bucket of a resource: its group, version and
// resource.
func (r apiRequest) collection() string { return r.groupVersion + "/" + r.resource }

// parseRequest reads an API path (/api/v1/..., /apis/GROUP/VERSION/...) and
// its query. Discovery paths (/api, /apis/GROUP/VERSION) have no verb.
func parseRequest(method string, u *url.URL) (apiRequest, error) {
	var r apiRequest
	parts := strings.Split(strings.Trim(u.Path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		r.groupVersion, parts = parts[1], parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		r.groupVersion, parts = parts[1]+"/"+parts[2], parts[3:]
	default:
		r.discovery = parts[0] == "api" || parts[0] == "apis" || parts[0] == "version" || parts[0] == "openapi"
		return r, nil
	}
	if len(parts) == 0 {
		r.discovery = true
		return r, nil
	}
	// namespaces/NS/RESOURCE...; namespaces and namespaces/NS alone are the
	// namespaces resource itself.
	if parts[0] == "namespaces" && len(parts) >= 3 {
		r.namespace, parts = parts[1], parts[2:]
	}
	r.resource = parts[0]
	if len(parts) > 1 {
		r.name = parts[1]
	}
	if len(parts) > 2 {
		r.subresource = strings.Join(parts[2:], "/")
	}
	for _, p := range []string{r.resource, r.name, r.namespace} {
		if p == "." || p == ".." {
			return r, fmt.Errorf("path %q names %q", u.Path, p)
		}
	}
	q := u.Query()
	watch := q.Get("watch") == "true" || q.Get("watch") == "1"
	switch method {
	case http.MethodGet, http.MethodHead:
		switch {
		case watch:
			r.verb = "watch"
		case r.name == "":
			r.verb = "list"
		default:
			r.verb = "get"
		}
	case http.MethodPost:
		r.verb = "create"
	case http.MethodPut:
		r.verb = "update"
	case http.MethodPatch:
		r.verb = "patch"
	case http.MethodDelete:
		r.verb = "delete"
		if r.name == "" {
			r.verb = "deletecollection"
		}
	default:
		r.verb = strings.ToLower(method)
	}
	r.initialEvents = r.verb == "watch" && q.Get("sendInitialEvents") == "true"
	var err error
	if r.labels, err = labels.Parse(q.Get("labelSelector")); err != nil {
		return r, fmt.Errorf("labelSelector: %w", err)
	}
	if r.fields, err = fields.ParseSelector(q.Get("fieldSelector")); err != nil {
		return r, fmt.Errorf("fieldSelector: %w", err)
	}
	// A watch of one object names it in a field selector, as the kubelet's
	// Secret and ConfigMap managers do; a get names it in the path.
	return r, nil
}
