// Package refdoc writes Dowse's reference pages (docs/reference) from the
// sources they describe: the CRDs' OpenAPI schemas, the Helm chart's
// values.schema.json with values.yaml, and dowsectl's command tree. Its
// output is deterministic (sorted, no dates), so that `make verify-generate`
// can tell when the committed pages are stale.
package refdoc

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

// Schema is the part of JSON Schema (and of the Kubernetes structural schema
// extensions) that the reference renders. It is decoded strictly: a keyword
// it does not know fails the generator instead of silently missing from the
// pages.
type Schema struct {
	Schema      string `json:"$schema,omitempty"`
	Title       string `json:"title,omitempty"`
	Type        Types  `json:"type,omitempty"`
	Format      string `json:"format,omitempty"`
	Description string `json:"description,omitempty"`
	// Default and Enum stay raw JSON, for shownJSON.
	Default              json.RawMessage    `json:"default,omitempty"`
	Enum                 []json.RawMessage  `json:"enum,omitempty"`
	Properties           map[string]*Schema `json:"properties,omitempty"`
	Required             []string           `json:"required,omitempty"`
	Items                *Schema            `json:"items,omitempty"`
	AdditionalProperties *SchemaOrBool      `json:"additionalProperties,omitempty"`
	AnyOf                []*Schema          `json:"anyOf,omitempty"`
	Nullable             bool               `json:"nullable,omitempty"`

	Minimum   *float64 `json:"minimum,omitempty"`
	Maximum   *float64 `json:"maximum,omitempty"`
	MinLength *int64   `json:"minLength,omitempty"`
	MaxLength *int64   `json:"maxLength,omitempty"`
	MinItems  *int64   `json:"minItems,omitempty"`
	MaxItems  *int64   `json:"maxItems,omitempty"`
	MinProps  *int64   `json:"minProperties,omitempty"`
	MaxProps  *int64   `json:"maxProperties,omitempty"`
	Pattern   string   `json:"pattern,omitempty"`

	IntOrString           bool         `json:"x-kubernetes-int-or-string,omitempty"`
	PreserveUnknownFields bool         `json:"x-kubernetes-preserve-unknown-fields,omitempty"`
	EmbeddedResource      bool         `json:"x-kubernetes-embedded-resource,omitempty"`
	ListType              string       `json:"x-kubernetes-list-type,omitempty"`
	ListMapKeys           []string     `json:"x-kubernetes-list-map-keys,omitempty"`
	MapType               string       `json:"x-kubernetes-map-type,omitempty"`
	Validations           []Validation `json:"x-kubernetes-validations,omitempty"`
}

// Validation is one CEL rule of a CRD schema.
type Validation struct {
	Rule              string `json:"rule"`
	Message           string `json:"message,omitempty"`
	MessageExpression string `json:"messageExpression,omitempty"`
	Reason            string `json:"reason,omitempty"`
	FieldPath         string `json:"fieldPath,omitempty"`
	OptionalOldSelf   bool   `json:"optionalOldSelf,omitempty"`
}

// Types is JSON Schema's type: one name, or a list of them.
type Types []string

// UnmarshalJSON takes a string or a list of strings.
func (t *Types) UnmarshalJSON(b []byte) error {
	var one string
	if err := json.Unmarshal(b, &one); err == nil {
		*t = Types{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("type must be a string or a list of strings: %w", err)
	}
	*t = many
	return nil
}

// SchemaOrBool is additionalProperties: false, true, or a schema for the
// values of a map.
type SchemaOrBool struct {
	Allowed bool
	Schema  *Schema
}

// UnmarshalJSON takes a boolean or a schema, the latter as strictly as the
// rest.
func (s *SchemaOrBool) UnmarshalJSON(b []byte) error {
	if err := json.Unmarshal(b, &s.Allowed); err == nil {
		return nil
	}
	s.Allowed = true
	s.Schema = new(Schema)
	return decodeStrict(b, s.Schema)
}

// ParseSchema decodes a JSON schema, refusing keywords the reference cannot
// render.
func ParseSchema(b []byte) (*Schema, error) {
	s := new(Schema)
	if err := decodeStrict(b, s); err != nil {
		return nil, err
	}
	return s, nil
}

func decodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("schema keyword the reference generator does not render (teach hack/docgen/refdoc): %w", err)
	}
	return nil
}

// mapValues is the schema of a map's values, nil when s is not a map.
func (s *Schema) mapValues() *Schema {
	if s.AdditionalProperties == nil || !s.AdditionalProperties.Allowed || len(s.Properties) > 0 {
		return nil
	}
	if s.AdditionalProperties.Schema == nil {
		return &Schema{}
	}
	return s.AdditionalProperties.Schema
}

// hasFields says whether s is an object with named fields, which get a
// table of their own.
func (s *Schema) hasFields() bool { return len(s.Properties) > 0 }

func (s *Schema) isRequired(name string) bool {
	for _, r := range s.Required {
		if r == name {
			return true
		}
	}
	return false
}

// typeName is s's type in words: "string", "integer (int32)", "list of
// string", "map of integer", "object", "int or string".
func (s *Schema) typeName() string {
	switch {
	case s.IntOrString:
		return "int or string"
	case s.Items != nil:
		return "list of " + s.Items.typeName()
	case s.mapValues() != nil:
		return "map of " + s.mapValues().typeName()
	}
	var names []string
	for _, t := range s.Type {
		if t == "array" {
			t = "list"
		}
		names = append(names, t)
	}
	name := strings.Join(names, " or ")
	if name == "" {
		name = "any"
		if len(s.AnyOf) > 0 {
			var alts []string
			for _, a := range s.AnyOf {
				alts = append(alts, a.typeName())
			}
			name = strings.Join(alts, " or ")
		}
	}
	if s.Format != "" {
		name += " (" + s.Format + ")"
	}
	if s.PreserveUnknownFields && !s.hasFields() {
		name += ", free-form"
	}
	if s.Nullable {
		name += ", nullable"
	}
	return name
}

// constraints are what the schema checks or fills in beyond the type, as
// sentences of Markdown for a table cell: default, allowed values, bounds,
// patterns, list semantics, CEL rules.
func (s *Schema) constraints() []string {
	var out []string
	if len(s.Default) > 0 {
		out = append(out, "Default: "+code(shownJSON(s.Default))+".")
	}
	if len(s.Enum) > 0 {
		var vals []string
		for _, e := range s.Enum {
			vals = append(vals, code(shownJSON(e)))
		}
		out = append(out, "One of: "+strings.Join(vals, ", ")+".")
	}
	if r := rangeText(s.Minimum, s.Maximum); r != "" {
		out = append(out, r)
	}
	if r := lengthText("Length", s.MinLength, s.MaxLength); r != "" {
		out = append(out, r)
	}
	if r := lengthText("Items", s.MinItems, s.MaxItems); r != "" {
		out = append(out, r)
	}
	if r := lengthText("Entries", s.MinProps, s.MaxProps); r != "" {
		out = append(out, r)
	}
	if s.Pattern != "" {
		out = append(out, "Pattern: "+code(s.Pattern)+".")
	}
	switch s.ListType {
	case "map":
		out = append(out, "A list keyed by "+joinCode(s.ListMapKeys)+": one item per key.")
	case "set":
		out = append(out, "Items are unique.")
	}
	for _, v := range s.Validations {
		switch {
		case v.Message != "":
			out = append(out, "Validated: "+text(v.Message)+".")
		default:
			out = append(out, "Validated: "+code(v.Rule)+".")
		}
	}
	return out
}

// eachOne says what every item (or value) of a list (or map) must be.
func eachOne(what string, constraints []string) string {
	c := strings.Join(constraints, " ")
	return "Each " + what + ": " + strings.ToLower(c[:1]) + c[1:]
}

func rangeText(minimum, maximum *float64) string {
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	switch {
	case minimum != nil && maximum != nil:
		return "From " + f(*minimum) + " to " + f(*maximum) + "."
	case minimum != nil:
		return "At least " + f(*minimum) + "."
	case maximum != nil:
		return "At most " + f(*maximum) + "."
	}
	return ""
}

func lengthText(what string, minimum, maximum *int64) string {
	switch {
	case minimum != nil && maximum != nil:
		return fmt.Sprintf("%s: %d to %d.", what, *minimum, *maximum)
	case minimum != nil:
		return fmt.Sprintf("%s: at least %d.", what, *minimum)
	case maximum != nil:
		return fmt.Sprintf("%s: at most %d.", what, *maximum)
	}
	return ""
}

// shownJSON is a value as a person would write it in YAML: a plain word
// unquoted, anything that would read as another type (or nothing) as JSON.
func shownJSON(raw json.RawMessage) string {
	var str string
	if err := json.Unmarshal(raw, &str); err == nil && str != "" && strings.TrimSpace(str) == str {
		var other any
		if err := yaml.Unmarshal([]byte(str), &other); err == nil {
			if _, isString := other.(string); isString {
				return str
			}
		}
	}
	return compactJSON(raw)
}

func compactJSON(raw json.RawMessage) string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, raw); err != nil {
		return string(raw)
	}
	return buf.String()
}

func joinCode(ss []string) string {
	var out []string
	for _, s := range ss {
		out = append(out, code(s))
	}
	return strings.Join(out, ", ")
}

// Object is one object with named fields found in a schema, at Path ("" for
// the root, "spec.deviceTemplate.properties[]" for the items of a list,
// "x[key]" for the values of a map).
type Object struct {
	Path   string
	Schema *Schema
	Fields []Field
}

// Field is one named field of an Object.
type Field struct {
	Name     string
	Path     string
	Schema   *Schema
	Required bool
	// Object is the path of the object the field holds (itself, or the
	// items or values it holds), "" when it holds no fields of its own.
	Object string
}

// Objects lists every object with named fields in s, depth first, each
// before the objects it holds. order sorts an object's field names (nil:
// alphabetical).
func Objects(s *Schema, order func(path string, names []string) []string) []Object {
	var out []Object
	var walk func(path string, s *Schema)
	walk = func(path string, s *Schema) {
		names := make([]string, 0, len(s.Properties))
		for n := range s.Properties {
			names = append(names, n)
		}
		sort.Strings(names)
		if order != nil {
			names = order(path, names)
		}
		obj := Object{Path: path, Schema: s}
		var nested []func()
		for _, n := range names {
			fs := s.Properties[n]
			f := Field{Name: n, Path: joinPath(path, n), Schema: fs, Required: s.isRequired(n)}
			if holder, p := fieldsHolder(f.Path, fs); holder != nil {
				f.Object = p
				nested = append(nested, func() { walk(p, holder) })
			}
			obj.Fields = append(obj.Fields, f)
		}
		out = append(out, obj)
		for _, n := range nested {
			n()
		}
	}
	walk("", s)
	return out
}

// fieldsHolder follows lists and maps from s down to the object with
// named fields they hold, with its path.
func fieldsHolder(path string, s *Schema) (*Schema, string) {
	for {
		switch {
		case s.hasFields():
			return s, path
		case s.Items != nil:
			s, path = s.Items, path+"[]"
		case s.mapValues() != nil:
			s, path = s.mapValues(), path+"[key]"
		default:
			return nil, ""
		}
	}
}

func joinPath(parent, name string) string {
	if parent == "" {
		return name
	}
	return parent + "." + name
}
