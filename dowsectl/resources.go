package dowsectl

import (
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/dowse-dev/dowse/shared/api/v1alpha1"
)

// resource is one of Dowse's kinds as the command line names it.
type resource struct {
	Kind, Plural, Singular string
	Short                  []string
}

// resources are the kinds of the dowse category, in the order `get dowse`
// prints them. Short names are the CRDs' own plus a few kubectl-like ones.
var resources = []resource{
	{Kind: "Configuration", Plural: "configurations", Singular: "configuration", Short: []string{"dcfg", "config", "configs", "cfg"}},
	{Kind: "Instance", Plural: "instances", Singular: "instance", Short: []string{"dins", "inst"}},
	{Kind: "DeviceModel", Plural: "devicemodels", Singular: "devicemodel", Short: []string{"dmodel", "model", "models"}},
	{Kind: "Device", Plural: "devices", Singular: "device", Short: []string{"ddev", "dev"}},
}

func (r resource) GVR() schema.GroupVersionResource {
	return v1alpha1.GroupVersion.WithResource(r.Plural)
}

func (r resource) GroupKind() schema.GroupKind {
	return schema.GroupKind{Group: v1alpha1.GroupVersion.Group, Kind: r.Kind}
}

// resourceNamed finds the resource a user's word names: plural, singular,
// short name or <plural>.dowse.dev, in any case.
func resourceNamed(word string) (resource, bool) {
	w := strings.ToLower(word)
	w = strings.TrimSuffix(w, "."+v1alpha1.GroupVersion.Group)
	for _, r := range resources {
		if w == r.Plural || w == r.Singular || w == strings.ToLower(r.Kind) || slices.Contains(r.Short, w) {
			return r, true
		}
	}
	return resource{}, false
}

// parseTypes reads a TYPE argument: one resource, a comma-separated list,
// or "dowse" / "all" for every kind.
func parseTypes(arg string) ([]resource, error) {
	var out []resource
	for _, w := range strings.Split(arg, ",") {
		if lw := strings.ToLower(w); lw == "dowse" || lw == "all" {
			out = append(out, resources...)
			continue
		}
		r, ok := resourceNamed(w)
		if !ok {
			return nil, usageErrorf("%q is not a Dowse resource type: use %s", w, typeList())
		}
		if !slices.ContainsFunc(out, func(o resource) bool { return o.Kind == r.Kind }) {
			out = append(out, r)
		}
	}
	return out, nil
}

func typeList() string {
	var names []string
	for _, r := range resources {
		names = append(names, r.Plural)
	}
	return strings.Join(names, ", ") + " or dowse (all of them)"
}

// target is what a get or describe is about: a kind and the names asked
// for (none: all of them).
type target struct {
	res   resource
	names []string
}

// parseTargets reads `TYPE [NAME...]` or `TYPE/NAME...` as kubectl does.
func parseTargets(args []string) ([]target, error) {
	if len(args) == 0 {
		return nil, usageErrorf("name a resource type: %s", typeList())
	}
	if strings.Contains(args[0], "/") {
		var out []target
		for _, a := range args {
			typ, name, ok := strings.Cut(a, "/")
			if !ok || name == "" {
				return nil, usageErrorf("%q: when one argument is TYPE/NAME, all must be", a)
			}
			r, ok := resourceNamed(typ)
			if !ok {
				return nil, usageErrorf("%q is not a Dowse resource type: use %s", typ, typeList())
			}
			if i := slices.IndexFunc(out, func(t target) bool { return t.res.Kind == r.Kind }); i >= 0 {
				out[i].names = append(out[i].names, name)
			} else {
				out = append(out, target{res: r, names: []string{name}})
			}
		}
		return out, nil
	}
	types, err := parseTypes(args[0])
	if err != nil {
		return nil, err
	}
	if len(args) > 1 && len(types) > 1 {
		return nil, usageErrorf("names need one resource type, not %q", args[0])
	}
	out := make([]target, len(types))
	for i, r := range types {
		out[i] = target{res: r, names: args[1:]}
	}
	return out, nil
}

func (t target) String() string { return fmt.Sprintf("%s %v", t.res.Plural, t.names) }
