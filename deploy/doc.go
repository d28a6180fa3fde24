// Package deploy holds deployment material for inboxkeeper: Kubernetes
// manifests, systemd units, the container image and a compose file, and the
// least-privilege SQL role script. It has no Go code of its own; its tests
// (deploy_test.go, chart_test.go, release_test.go) parse every file here and
// check it against the product: the commands, the environment variables, the
// policy file and the control schema. See docs/operations/deploying.md.
//
// Not a library: the deployment material and its tests.
package deploy
