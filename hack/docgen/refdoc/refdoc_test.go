package refdoc

import (
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// widgetCRD has what the walker must get right: an object in a list in an
// object, a map of objects, required fields at two depths, an enum with a
// value that would read as a number, a CEL rule, and descriptions with
// characters Markdown would take for HTML or table syntax.
const widgetCRD = `
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {name: widgets.example.dev}
spec:
  group: example.dev
  names: {kind: Widget, plural: widgets, shortNames: [wd]}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        description: Widget is a test kind.
        type: object
        properties:
          apiVersion: {type: string}
          kind: {type: string}
          metadata: {type: object}
          spec:
            type: object
            required: [mode]
            properties:
              mode:
                type: string
                description: Mode is <fast> or slow | never.
                default: Fast
                enum: [Fast, Slow, "1"]
              parts:
                type: array
                maxItems: 4
                x-kubernetes-list-type: map
                x-kubernetes-list-map-keys: [name]
                items:
                  description: Part is one part.
                  type: object
                  required: [name]
                  x-kubernetes-validations:
                  - rule: "has(self.a) || has(self.b)"
                    message: a or b
                  properties:
                    name: {type: string, pattern: "^[a-z]+$"}
                    labels:
                      type: object
                      additionalProperties:
                        type: object
                        properties:
                          value: {type: integer, format: int32, minimum: 0}
              tags:
                type: array
                items: {type: string, maxLength: 8}
`

func TestObjectsWalksListsAndMaps(t *testing.T) {
	crd, err := ParseCRD([]byte(widgetCRD))
	if err != nil {
		t.Fatal(err)
	}
	s, err := ParseSchema(crd.Spec.Versions[0].Schema.OpenAPIV3Schema)
	if err != nil {
		t.Fatal(err)
	}
	objs := Objects(s, nil)
	var paths []string
	for _, o := range objs {
		paths = append(paths, o.Path)
	}
	want := []string{"", "spec", "spec.parts[]", "spec.parts[].labels[key]"}
	if strings.Join(paths, ",") != strings.Join(want, ",") {
		t.Fatalf("objects %q, want %q", paths, want)
	}
	spec := objs[1]
	fields := map[string]Field{}
	for _, f := range spec.Fields {
		fields[f.Name] = f
	}
	if !fields["mode"].Required || fields["parts"].Required {
		t.Errorf("required: mode %v, parts %v; want true, false", fields["mode"].Required, fields["parts"].Required)
	}
	if got := fields["parts"].Object; got != "spec.parts[]" {
		t.Errorf("parts holds %q, want spec.parts[]", got)
	}
	if got := fields["tags"].Object; got != "" {
		t.Errorf("tags (a list of strings) holds object %q", got)
	}
	if got := fields["tags"].Schema.typeName(); got != "list of string" {
		t.Errorf("tags type %q", got)
	}
	if got := objs[2].Fields[0].Schema.typeName(); got != "map of object" {
		t.Errorf("labels type %q", got)
	}
}

func TestCRDPage(t *testing.T) {
	crd, err := ParseCRD([]byte(widgetCRD))
	if err != nil {
		t.Fatal(err)
	}
	b, err := CRDPage([]*CRD{crd}, "From a test.")
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, want := range []string{
		"## Widget\n\nWidget is a test kind.\n\n`apiVersion: example.dev/v1`, namespaced; `kubectl get widgets`; short names `wd`; status is a subresource.",
		"| `mode` | string | yes | Mode is &lt;fast&gt; or slow &#124; never.<br>Default: `Fast`. One of: `Fast`, `Slow`, `\"1\"`. |",
		"| `parts` | list of [object](#widgetspecparts) |  | Part is one part.<br>Items: at most 4. A list keyed by `name`: one item per key. |",
		"| `tags` | list of string |  | Each item: length: at most 8. |",
		"### Widget.spec.parts[]\n\nPart is one part.\n\nValidated: a or b.\n\n",
		"| `name` | string | yes | Pattern: `^[a-z]+$`. |",
		"| `labels` | map of [object](#widgetspecpartslabelskey) |  |  |",
		"### Widget.spec.parts[].labels[key]",
		"| `value` | integer (int32) |  | At least 0. |",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q\n%s", want, page)
		}
	}
	if strings.Contains(page, "`apiVersion`, `kind` and `metadata`") && strings.Contains(page, "| `metadata` |") {
		t.Error("the standard fields have rows")
	}
	// Every link within the page goes to a heading of the page.
	headings := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^#+ (.+)$`).FindAllStringSubmatch(page, -1) {
		headings[anchor(m[1])] = true
	}
	for _, m := range regexp.MustCompile(`\]\(#([^)]+)\)`).FindAllStringSubmatch(page, -1) {
		if !headings[m[1]] {
			t.Errorf("link to #%s, which no heading has", m[1])
		}
	}
}

func TestParseSchemaRefusesUnknownKeywords(t *testing.T) {
	if _, err := ParseSchema([]byte(`{"type":"object","properties":{"a":{"type":"string","oneOf":[]}}}`)); err == nil {
		t.Fatal("a nested keyword the generator does not render was accepted")
	}
	if _, err := ParseSchema([]byte(`{"type":"object","additionalProperties":{"type":"string","const":"x"}}`)); err == nil {
		t.Fatal("a keyword inside additionalProperties was accepted")
	}
	s, err := ParseSchema([]byte(`{"type":["object","string"],"additionalProperties":false}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := s.typeName(); got != "object or string" {
		t.Errorf("type %q", got)
	}
}

const testValuesSchema = `{
  "title": "Values of a test chart",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "zeta": {"type": "boolean"},
    "alpha": {
      "type": "object",
      "description": "Alpha from the schema.",
      "properties": {
        "ports": {"type": "object", "properties": {"metrics": {"type": "integer", "minimum": 1, "maximum": 65535}}},
        "args": {"type": "array", "items": {"type": "string"}}
      }
    },
    "extras": {
      "type": "array",
      "items": {"type": "object", "required": ["name"], "properties": {"name": {"type": "string", "minLength": 1}}}
    }
  }
}`

const testValues = `# The file's own comment, about nothing in particular.

# Zeta turns things on.
zeta: true
alpha:
  # Where metrics are served.
  ports: {metrics: 9000}
  args: [--a, --b]
extras: []
`

func TestValuesPage(t *testing.T) {
	b, err := ValuesPage([]byte(testValuesSchema), []byte(testValues), "From a test.")
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, want := range []string{
		"# Values of a test chart\n\nFrom a test.",
		"| `zeta` | boolean | `true` | Zeta turns things on. |",
		"## alpha\n\nAlpha from the schema.",
		// values.yaml's order, not the alphabet: ports before args.
		"| `alpha.ports` | object |  | Where metrics are served. |\n| `alpha.ports.metrics` | integer | `9000` | From 1 to 65535. |\n| `alpha.args` | list of string | `[--a, --b]` |  |",
		"## extras\n\n`extras`: list of object, default `[]`.",
		"| `extras[].name` | string |  | Required. Length: at least 1. |",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q\n%s", want, page)
		}
	}
	if strings.Contains(page, "particular") {
		t.Error("the file's opening comment was taken for a value's")
	}

	_, err = ValuesPage([]byte(testValuesSchema), []byte(testValues+"alpha2: 1\n"), "")
	if err == nil || !strings.Contains(err.Error(), "alpha2") {
		t.Errorf("a value the schema does not describe: err %v, want one naming alpha2", err)
	}
}

func TestCLIPage(t *testing.T) {
	root := &cobra.Command{Use: "tool", Short: "A tool", RunE: func(*cobra.Command, []string) error { return nil }}
	root.PersistentFlags().String("kubeconfig", "", "kubeconfig to use")
	root.PersistentFlags().Bool("verbose", false, "say more")
	get := &cobra.Command{Use: "get NAME", Short: "Get one", Example: "  tool get x",
		Long: "Get prints one.\n\nColumns:\n  name   the name\n  <dir>  where", RunE: func(*cobra.Command, []string) error { return nil }}
	get.Flags().StringP("output", "o", "text", "`format`: text or json | yaml")
	get.Flags().Duration("wait", 0, "wait")
	get.Flags().Lookup("wait").NoOptDefVal = "1m0s"
	set := &cobra.Command{Use: "set", Short: "Set <things>", Long: "Sets a <value>.", RunE: func(*cobra.Command, []string) error { return nil }}
	secret := &cobra.Command{Use: "secret", Hidden: true, RunE: func(*cobra.Command, []string) error { return nil }}
	root.AddCommand(get, set, secret)

	common := pflag.NewFlagSet("kubectl", pflag.ContinueOnError)
	common.String("kubeconfig", "", "kubeconfig to use")
	b, err := CLIPage(root, "From a test.", common, "Connection flags", "Kubectl's.")
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, want := range []string{
		"- [tool get](#tool-get): Get one",
		"## Connection flags\n\nKubectl's.\n\n| Flag | Type | Default | Description |\n| --- | --- | --- | --- |\n| `--kubeconfig` | string |  | kubeconfig to use |\n\n",
		"## tool get\n\nGet one\n\n```text\ntool get NAME [flags]\n```\n\n```text\nGet prints one.\n\nColumns:\n  name   the name\n  <dir>  where\n```",
		"Examples:\n\n```text\n  tool get x\n```",
		"| `-o, --output` | format | `text` | format: text or json &#124; yaml |",
		"| `--wait[=1m0s]` | duration |  | wait |",
		"Flags of its parent commands:\n\n| Flag | Type | Default | Description |\n| --- | --- | --- | --- |\n| `--verbose` | bool |  | say more |",
		"## tool set\n\nSet &lt;things&gt;\n\n```text\ntool set\n```\n\nSets a &lt;value&gt;.",
		"## tool completion bash",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q\n%s", want, page)
		}
	}
	if n := strings.Count(page, "`--kubeconfig`"); n != 1 {
		t.Errorf("--kubeconfig listed %d times, want once (in the connection flags)", n)
	}
	if strings.Contains(page, "secret") || strings.Contains(page, "tool help") {
		t.Error("a hidden command or help is listed")
	}
}

func TestHeadingsWithOneAnchorFail(t *testing.T) {
	p := newPage()
	p.heading(2, "Kind.spec.a.b")
	p.heading(2, "Kind.spec.ab")
	if _, err := p.bytes(); err == nil {
		t.Fatal("two headings with the anchor kindspecab were accepted")
	}
}
