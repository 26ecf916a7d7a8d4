// openapi-gen reads a package's tags from doc.go.

// +k8s:openapi-gen=true

package v1alpha1
