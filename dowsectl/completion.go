package dowsectl

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Shell completion: cobra's `completion bash|zsh|fish|powershell` scripts
// call back into the binary (`__complete`), which lists the resource names
// with the flags already typed (--kubeconfig, --context, -n), as kubectl's
// completion does. kubectl itself completes `kubectl dowse ...` through
// kubectl_complete-dowse, a link to this binary.

// completionTimeout bounds a completion's API request: a shell waits for it.
const completionTimeout = 5 * time.Second

// listNames lists the names of res's objects in the namespace the flags
// name, starting with prefix.
func (c *cli) listNames(ctx context.Context, res resource, prefix string) []string {
	ns, err := c.namespace()
	if err != nil {
		return nil
	}
	dyn, err := c.dynamic()
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, completionTimeout)
	defer cancel()
	list, err := dyn.Resource(res.GVR()).Namespace(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil
	}
	var out []string
	for _, o := range list.Items {
		if strings.HasPrefix(o.GetName(), prefix) {
			out = append(out, o.GetName())
		}
	}
	return out
}

// completeTypeThenNames completes `get`'s and `describe`'s TYPE, then the
// names of that type (or TYPE/NAME when the user started so).
func (c *cli) completeTypeThenNames(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	if len(args) == 0 {
		if typ, prefix, ok := strings.Cut(toComplete, "/"); ok {
			r, found := resourceNamed(typ)
			if !found {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			var out []string
			for _, n := range c.listNames(cmd.Context(), r, prefix) {
				out = append(out, typ+"/"+n)
			}
			return out, cobra.ShellCompDirectiveNoFileComp
		}
		var out []string
		for _, r := range resources {
			if strings.HasPrefix(r.Plural, toComplete) {
				out = append(out, r.Plural)
			}
		}
		if strings.HasPrefix("dowse", toComplete) { //nolint:gocritic // does what is typed begin the word "dowse"
			out = append(out, "dowse")
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
	if strings.Contains(args[0], "/") {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	r, ok := resourceNamed(args[0])
	if !ok {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	names := c.listNames(cmd.Context(), r, toComplete)
	return slices.DeleteFunc(names, func(n string) bool { return slices.Contains(args[1:], n) }), cobra.ShellCompDirectiveNoFileComp
}

// completeNames completes the first argument with res's names.
func (c *cli) completeNames(res resource) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return c.listNames(cmd.Context(), res, toComplete), cobra.ShellCompDirectiveNoFileComp
	}
}

// registerFlagCompletions completes -n with the namespaces and --context,
// --cluster and --user with the kubeconfig's names.
func (c *cli) registerFlagCompletions(root *cobra.Command) {
	_ = root.RegisterFlagCompletionFunc("namespace", func(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		cs, err := c.kube()
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(cmd.Context(), completionTimeout)
		defer cancel()
		list, err := cs.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		var out []string
		for _, n := range list.Items {
			if strings.HasPrefix(n.Name, toComplete) {
				out = append(out, n.Name)
			}
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	})
	fromKubeconfig := func(names func(contexts, clusters, users []string) []string) cobra.CompletionFunc {
		return func(_ *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			raw, err := c.flags.ToRawKubeConfigLoader().RawConfig()
			if err != nil {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			var ctxs, clusters, users []string
			for n := range raw.Contexts {
				ctxs = append(ctxs, n)
			}
			for n := range raw.Clusters {
				clusters = append(clusters, n)
			}
			for n := range raw.AuthInfos {
				users = append(users, n)
			}
			var out []string
			for _, n := range names(ctxs, clusters, users) {
				if strings.HasPrefix(n, toComplete) {
					out = append(out, n)
				}
			}
			slices.Sort(out)
			return out, cobra.ShellCompDirectiveNoFileComp
		}
	}
	_ = root.RegisterFlagCompletionFunc("context", fromKubeconfig(func(c, _, _ []string) []string { return c }))
	_ = root.RegisterFlagCompletionFunc("cluster", fromKubeconfig(func(_, c, _ []string) []string { return c }))
	_ = root.RegisterFlagCompletionFunc("user", fromKubeconfig(func(_, _, u []string) []string { return u }))
}
