// Package bootstrap is the format of what an edge node's link identity is
// bootstrapped from, kept as Secrets in the controller's namespace: the
// link CA (CASecret, ParseCASecret, LoadOrCreateCA) and bootstrap tokens
// (TokenSecret, ParseTokenSecret, Tokens), each format beside its parse,
// as Kubernetes' k8s.io/cluster-bootstrap keeps kubeadm's tokens. Both the
// controller's linkauth, which trades tokens for certificates, and
// dowsectl, which mints tokens and prints the CA's pin, import it, so
// neither copies the other's names. The token's own text ("<id>.<secret>")
// is the link's wire format, in internal/link/pki.
package bootstrap

import typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"

// SecretClient is client-go's Secret client for one namespace, the
// controller's (clientset.CoreV1().Secrets(ns)). Not controller-runtime's
// cached client: that would cache every Secret in the cluster.
type SecretClient = typedcorev1.SecretInterface
