package v1alpha1

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestFinalizerIsAlwaysValid(t *testing.T) {
	for _, node := range []string{"node-a", "ip-10-0-0-1.eu-west-1.compute.internal", strings.Repeat("n", 63), strings.Repeat("n", 64) + ".example.com"} {
		f := AgentFinalizer(node)
		if len(f) > len("agent.dowse.dev/")+63 {
			t.Fatalf("%s: finalizer %q too long", node, f)
		}
		if errs := validation.IsQualifiedName(f); len(errs) > 0 {
			t.Fatalf("%s: finalizer %q is invalid: %v", node, f, errs)
		}
		if AgentFinalizer(node) != f {
			t.Fatal("finalizer is not stable")
		}
	}
	if AgentFinalizer(strings.Repeat("a", 70)) == AgentFinalizer(strings.Repeat("a", 71)) {
		t.Fatal("long node names must not share a finalizer")
	}
}

func TestNodeLabelIsAlwaysValid(t *testing.T) {
	for _, node := range []string{"node-a", "ip-10-0-0-1.eu-west-1.compute.internal", strings.Repeat("n", 63), strings.Repeat("n", 45) + ".-" + strings.Repeat("x", 30)} {
		l := NodeLabel(node)
		if errs := validation.IsQualifiedName(l); len(errs) > 0 {
			t.Fatalf("%s: label %q is invalid: %v", node, l, errs)
		}
		if len(node) <= 63 && l != "nodes.dowse.dev/"+node {
			t.Fatalf("%s: label %q should name the node as it is (the admission policy compares it)", node, l)
		}
	}
	if NodeLabel(strings.Repeat("a", 70)) == NodeLabel(strings.Repeat("a", 71)) {
		t.Fatal("long node names must not share a label")
	}
}
