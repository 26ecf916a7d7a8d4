package discovery

import (
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
)

func TestDetailsText(t *testing.T) {
	for _, c := range []struct {
		raw  string
		want string
	}{
		{"", ""},
		{`{"udevRules":["SUBSYSTEM==\"tty\""]}`, `{"udevRules":["SUBSYSTEM==\"tty\""]}`},
		// Akri's form: the YAML text in a string.
		{`"udevRules:\n- SUBSYSTEM==\"tty\"\n"`, "udevRules:\n- SUBSYSTEM==\"tty\"\n"},
		{`[1,2]`, `[1,2]`},
	} {
		var d *apiextensionsv1.JSON
		if c.raw != "" {
			d = &apiextensionsv1.JSON{Raw: []byte(c.raw)}
		}
		if got := DetailsText(d); got != c.want {
			t.Errorf("DetailsText(%s) = %q, want %q", c.raw, got, c.want)
		}
	}
}
