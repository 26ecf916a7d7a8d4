package refdoc

import (
	"fmt"
	"sort"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// valuesFile is values.yaml read as nodes: each value's comment and
// default, and the order of its keys.
type valuesFile struct {
	keys     map[string]*yaml.Node // path -> key node (its comments)
	values   map[string]*yaml.Node // path -> value node
	children map[string][]string   // path -> keys of the mapping, in file order
}

func parseValues(b []byte) (*valuesFile, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, err
	}
	v := &valuesFile{keys: map[string]*yaml.Node{}, values: map[string]*yaml.Node{}, children: map[string][]string{}}
	if len(doc.Content) == 0 {
		return v, nil
	}
	var walk func(path string, n *yaml.Node)
	walk = func(path string, n *yaml.Node) {
		if n.Kind != yaml.MappingNode {
			return
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, val := n.Content[i], n.Content[i+1]
			p := joinPath(path, k.Value)
			v.keys[p], v.values[p] = k, val
			v.children[path] = append(v.children[path], k.Value)
			walk(p, val)
		}
	}
	walk("", doc.Content[0])
	return v, nil
}

// comment is the comment written above (or beside) the key at path,
// without its #s.
func (v *valuesFile) comment(path string) string {
	k := v.keys[path]
	if k == nil {
		return ""
	}
	var lines []string
	for _, c := range []string{k.HeadComment, k.LineComment} {
		for _, l := range strings.Split(c, "\n") {
			l = strings.TrimPrefix(strings.TrimSpace(l), "#")
			lines = append(lines, strings.TrimPrefix(l, " "))
		}
	}
	return strings.TrimSpace(strings.Join(lines, "\n"))
}

// defaultValue is the value at path in values.yaml as one line of YAML
// (flow style), "" when values.yaml has none.
func (v *valuesFile) defaultValue(path string) (string, error) {
	n := v.values[path]
	if n == nil {
		return "", nil
	}
	flow := flowCopy(n)
	b, err := yaml.Marshal(flow)
	if err != nil {
		return "", fmt.Errorf("values.yaml %s: %w", path, err)
	}
	return strings.TrimSpace(string(b)), nil
}

func flowCopy(n *yaml.Node) *yaml.Node {
	c := *n
	c.HeadComment, c.LineComment, c.FootComment = "", "", ""
	if c.Kind == yaml.MappingNode || c.Kind == yaml.SequenceNode {
		c.Style = yaml.FlowStyle
	}
	c.Content = nil
	for _, ch := range n.Content {
		c.Content = append(c.Content, flowCopy(ch))
	}
	return &c
}

// order puts an object's fields in values.yaml's order, which groups them
// by topic; fields values.yaml leaves out follow in alphabetical order.
func (v *valuesFile) order(path string, names []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, k := range v.children[path] {
		for _, n := range names {
			if n == k && !seen[n] {
				out = append(out, n)
				seen[n] = true
			}
		}
	}
	for _, n := range names {
		if !seen[n] {
			out = append(out, n)
		}
	}
	return out
}

// ValuesPage is the reference of a chart's values: every value
// values.schema.json describes, with its type, its default from
// values.yaml and its description (the schema's, else values.yaml's
// comment). A value in values.yaml that the schema has no field for fails
// it, as the page would miss it.
func ValuesPage(schemaJSON, valuesYAML []byte, intro string) ([]byte, error) {
	s, err := ParseSchema(schemaJSON)
	if err != nil {
		return nil, fmt.Errorf("values.schema.json: %w", err)
	}
	vals, err := parseValues(valuesYAML)
	if err != nil {
		return nil, fmt.Errorf("values.yaml: %w", err)
	}
	objects := Objects(s, vals.order)
	byPath := map[string]Object{}
	for _, o := range objects {
		byPath[o.Path] = o
	}
	if err := vals.checkCovered(byPath); err != nil {
		return nil, err
	}

	p := newPage()
	title := s.Title
	if title == "" {
		title = "Chart values"
	}
	p.heading(1, title)
	p.printf("%s\n\n", intro)

	// Top-level plain values first, then a section per top-level object,
	// each listing its values depth first with their full paths (as
	// --set takes them).
	root := objects[0]
	var plain []Field
	var sections []Field
	for _, f := range root.Fields {
		if f.Object != "" {
			sections = append(sections, f)
		} else {
			plain = append(plain, f)
		}
	}
	header := []string{"Value", "Type", "Default", "Description"}
	if len(plain) > 0 {
		p.heading(2, "Top-level values")
		rows, err := valueRows(plain, byPath, vals)
		if err != nil {
			return nil, err
		}
		p.table(header, rows)
	}
	for _, f := range sections {
		p.heading(2, f.Name)
		if d := description(f, vals); d != "" {
			p.printf("%s\n\n", prose(d))
		}
		if f.Object != f.Path { // a list or map of objects: what the rows' paths are in
			def, err := vals.defaultValue(f.Path)
			if err != nil {
				return nil, err
			}
			line := code(f.Path) + ": " + f.Schema.typeName()
			if def != "" {
				line += ", default " + code(def)
			}
			p.printf("%s.\n\n", line)
		}
		rows, err := valueRows(byPath[f.Object].Fields, byPath, vals)
		if err != nil {
			return nil, err
		}
		p.table(header, rows)
	}
	return p.bytes()
}

// valueRows are the rows of fields and, after each, of the fields of the
// object it holds.
func valueRows(fields []Field, byPath map[string]Object, vals *valuesFile) ([][]string, error) {
	var rows [][]string
	for _, f := range fields {
		def, err := vals.defaultValue(f.Path)
		if err != nil {
			return nil, err
		}
		if f.Object == f.Path {
			def = "" // its values have a row each
		}
		if def != "" {
			def = code(def)
		}
		desc := text(description(f, vals))
		parts := f.Schema.constraints()
		if inner := f.Schema.Items; inner != nil && !inner.hasFields() {
			if c := inner.constraints(); len(c) > 0 {
				parts = append(parts, eachOne("item", c))
			}
		}
		if inner := f.Schema.mapValues(); inner != nil && !inner.hasFields() {
			if c := inner.constraints(); len(c) > 0 {
				parts = append(parts, eachOne("value", c))
			}
		}
		if f.Required {
			parts = append([]string{"Required."}, parts...)
		}
		if len(parts) > 0 {
			if desc != "" {
				desc += "<br>"
			}
			desc += strings.Join(parts, " ")
		}
		rows = append(rows, []string{code(f.Path), f.Schema.typeName(), def, desc})
		if f.Object != "" {
			sub, err := valueRows(byPath[f.Object].Fields, byPath, vals)
			if err != nil {
				return nil, err
			}
			rows = append(rows, sub...)
		}
	}
	return rows, nil
}

func description(f Field, vals *valuesFile) string {
	if f.Schema.Description != "" {
		return f.Schema.Description
	}
	return vals.comment(f.Path)
}

// checkCovered fails on a key of values.yaml inside an object the schema
// names fields of, when the schema has no field of that name.
func (v *valuesFile) checkCovered(byPath map[string]Object) error {
	var missing []string
	for path, keys := range v.children {
		o, ok := byPath[path]
		if !ok {
			continue // a free-form object, or a value the schema does not describe
		}
		for _, k := range keys {
			if _, ok := o.Schema.Properties[k]; !ok {
				missing = append(missing, joinPath(path, k))
			}
		}
	}
	if len(missing) > 0 {
		sort.Strings(missing)
		return fmt.Errorf("values.yaml has values values.schema.json does not describe: %s", strings.Join(missing, ", "))
	}
	return nil
}
