package refdoc

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"sigs.k8s.io/yaml"
)

// CRD is the part of a CustomResourceDefinition the reference shows.
type CRD struct {
	Spec struct {
		Group string `json:"group"`
		Names struct {
			Kind       string   `json:"kind"`
			Plural     string   `json:"plural"`
			ShortNames []string `json:"shortNames"`
			Categories []string `json:"categories"`
		} `json:"names"`
		Scope    string `json:"scope"`
		Versions []struct {
			Name    string `json:"name"`
			Served  bool   `json:"served"`
			Storage bool   `json:"storage"`
			Columns []struct {
				Name     string `json:"name"`
				JSONPath string `json:"jsonPath"`
				Priority int    `json:"priority"`
			} `json:"additionalPrinterColumns"`
			Subresources struct {
				Status *struct{} `json:"status"`
			} `json:"subresources"`
			Schema struct {
				OpenAPIV3Schema json.RawMessage `json:"openAPIV3Schema"`
			} `json:"schema"`
		} `json:"versions"`
	} `json:"spec"`
}

// ParseCRD reads one CRD manifest (YAML).
func ParseCRD(b []byte) (*CRD, error) {
	var c CRD
	if err := yaml.Unmarshal(b, &c); err != nil {
		return nil, err
	}
	if c.Spec.Names.Kind == "" {
		return nil, fmt.Errorf("not a CustomResourceDefinition (no spec.names.kind)")
	}
	return &c, nil
}

// standardFields are every object's own, described by Kubernetes, not here.
var standardFields = map[string]bool{"apiVersion": true, "kind": true, "metadata": true}

// CRDPage is the reference of crds, in the order given. source says where
// the CRDs come from, for the page's first lines.
func CRDPage(crds []*CRD, source string) ([]byte, error) {
	p := newPage()
	p.heading(1, "Custom resources")
	p.printf("%s\n\n", source)
	var kinds []string
	for _, c := range crds {
		kinds = append(kinds, fmt.Sprintf("[%s](#%s)", c.Spec.Names.Kind, anchor(c.Spec.Names.Kind)))
	}
	p.printf("Kinds: %s. Every object also has `apiVersion`, `kind` and `metadata` "+
		"(Kubernetes' ObjectMeta), left out below. In a field's path, `[]` stands for "+
		"each item of a list and `[key]` for each value of a map; *required* means "+
		"required whenever the object holding the field is given.\n\n", strings.Join(kinds, ", "))
	for _, c := range crds {
		for _, v := range c.Spec.Versions {
			if !v.Served {
				continue
			}
			s, err := ParseSchema(v.Schema.OpenAPIV3Schema)
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", c.Spec.Names.Kind, v.Name, err)
			}
			kind := c.Spec.Names.Kind
			if len(c.Spec.Versions) > 1 {
				kind += " " + v.Name
			}
			p.heading(2, kind)
			if s.Description != "" {
				p.printf("%s\n\n", prose(s.Description))
			}
			facts := []string{
				fmt.Sprintf("`apiVersion: %s/%s`, %s", c.Spec.Group, v.Name, strings.ToLower(c.Spec.Scope)),
				"`kubectl get " + c.Spec.Names.Plural + "`",
			}
			if len(c.Spec.Names.ShortNames) > 0 {
				facts = append(facts, "short names "+backquoteAll(c.Spec.Names.ShortNames))
			}
			if len(c.Spec.Names.Categories) > 0 {
				facts = append(facts, "categories "+backquoteAll(c.Spec.Names.Categories))
			}
			if v.Subresources.Status != nil {
				facts = append(facts, "status is a subresource")
			}
			p.printf("%s.\n\n", strings.Join(facts, "; "))
			if len(v.Columns) > 0 {
				var cols []string
				for _, col := range v.Columns {
					w := ""
					if col.Priority > 0 {
						w = ", with -o wide"
					}
					cols = append(cols, fmt.Sprintf("%s (`%s`%s)", col.Name, col.JSONPath, w))
				}
				p.printf("Columns of `kubectl get`: %s.\n\n", strings.Join(cols, ", "))
			}
			writeObjects(p, kind, s)
		}
	}
	return p.bytes()
}

func backquoteAll(ss []string) string {
	var out []string
	for _, s := range ss {
		out = append(out, "`"+s+"`")
	}
	return strings.Join(out, ", ")
}

// writeObjects writes one table per object with named fields: the kind's
// own first (its heading already written), then each nested one under a
// heading named like kubectl explain's argument (Kind.spec.x).
func writeObjects(p *page, kind string, root *Schema) {
	objects := Objects(root, nil)
	anchors := map[string]string{}
	for _, o := range objects[1:] {
		anchors[o.Path] = anchor(kind + "." + o.Path)
	}
	for i, o := range objects {
		if i > 0 {
			p.heading(3, kind+"."+o.Path)
			if d := o.Schema.Description; d != "" {
				p.printf("%s\n\n", prose(d))
			}
			// A field's own checks are in its row; those of each item or
			// value of a list or map are here.
			if c := o.Schema.constraints(); len(c) > 0 && strings.HasSuffix(o.Path, "]") {
				p.printf("%s\n\n", strings.Join(c, " "))
			}
		}
		var rows [][]string
		for _, f := range o.Fields {
			if o.Path == "" && standardFields[f.Name] {
				continue
			}
			typ := f.Schema.typeName()
			if f.Object != "" {
				typ = linkObject(typ, anchors[f.Object])
			}
			req := ""
			if f.Required {
				req = "yes"
			}
			rows = append(rows, []string{code(f.Name), typ, req, fieldDescription(f)})
		}
		p.table([]string{"Field", "Type", "Required", "Description"}, rows)
	}
}

// linkObject makes the word object in a type name ("list of object") a
// link to the object's table.
func linkObject(typ, anchor string) string {
	i := strings.LastIndex(typ, "object")
	if i < 0 {
		return typ
	}
	return typ[:i] + "[object](#" + anchor + ")" + typ[i+len("object"):]
}

// fieldDescription is a field's description and what its schema checks;
// for a list or map of plain values, what each item or value must be too.
func fieldDescription(f Field) string {
	s := f.Schema
	desc := s.Description
	parts := s.constraints()
	inner, what := s.Items, "item"
	if inner == nil {
		inner, what = s.mapValues(), "value"
	}
	if inner != nil {
		if desc == "" {
			desc = inner.Description
		}
		if c := inner.constraints(); len(c) > 0 && !inner.hasFields() {
			parts = append(parts, eachOne(what, c))
		}
	}
	out := text(desc)
	if len(parts) > 0 {
		if out != "" {
			out += "<br>"
		}
		out += strings.Join(parts, " ")
	}
	return out
}

// SortKinds orders CRDs by the way data flows through Dowse, as the rank
// lists the kinds; others follow in alphabetical order.
func SortKinds(crds []*CRD, rank ...string) {
	pos := func(k string) int {
		for i, r := range rank {
			if r == k {
				return i
			}
		}
		return len(rank)
	}
	sort.SliceStable(crds, func(i, j int) bool {
		a, b := crds[i].Spec.Names.Kind, crds[j].Spec.Names.Kind
		if pa, pb := pos(a), pos(b); pa != pb {
			return pa < pb
		}
		return a < b
	})
}
