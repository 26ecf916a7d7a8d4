// Package linkauth gives edge nodes their identity on the cloud/edge link:
// the HTTPS endpoint where an edge trades a bootstrap token (or its agent
// pod's service account token) for a client certificate naming
// "node:<name>" and later renews it. The link CA and the token Secrets it
// reads are in internal/bootstrap, which dowsectl shares.
//
// Everything it keeps is in the API server, so any number of controller
// replicas may serve the endpoint at once, leader or not.
package linkauth
