// Package kubecheck checks the Kubernetes material in deploy/ against the
// Kubernetes API types of a pinned version (k8s.io/api in this module's
// go.mod) and renders the Helm chart with Helm's own engine, as `helm
// template` does. It is a module of its own so that Helm and the Kubernetes
// libraries stay out of the daemon's go.mod; .ci/run runs its tests.
// No cluster is needed.
package kubecheck
