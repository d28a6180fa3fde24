// Package deploy holds deployment material for inboxkeeper: Kubernetes
// manifests, systemd units, the container image and a compose file, and the
// least-privilege SQL role script. It has no Go code of its own; its test
// (deploy_test.go) parses every file here and checks it against the product:
// the commands, the environment variables, the policy file and the control
// schema. See docs/operations/deploying.md.
//
// Not a library: the deployment material and its tests.
package deploy
