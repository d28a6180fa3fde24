package deploy_test

// These tests keep the deployment material honest. There is no Kubernetes,
// systemd or Docker engine here, so the manifests are parsed and checked
// against the product itself: the image and its commands, the variables
// config.KnownVariables() accepts, the policy file parser, the retention
// planner and the control schema's tables. The role script is applied to a
// real PostgreSQL, and the real binary runs every command as its roles.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/robfig/cron/v3"
	"go.yaml.in/yaml/v3"

	"github.com/inboxkeeper/inboxkeeper/inbox"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/config"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/policy"
	"github.com/inboxkeeper/inboxkeeper/internal/platform/retry"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/pgtest"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/syncbuf"
	"github.com/inboxkeeper/inboxkeeper/internal/testkit/testfile"
	"github.com/inboxkeeper/inboxkeeper/migrations"
	"github.com/inboxkeeper/inboxkeeper/retention"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// image is the one image every manifest runs, built from docker/Dockerfile.
const image = "ghcr.io/inboxkeeper/inboxkeeper:latest"

// The files, relative to this directory (go test runs in it).
const (
	policyExample  = "docker/inboxkeeper.yaml"
	dockerfile     = "docker/Dockerfile"
	dockerignore   = "docker/Dockerfile.dockerignore"
	composeFile    = "docker/compose.yaml"
	roleScript     = "sql/role.sql"
	envExample     = "systemd/inboxkeeper.env.example"
	daemonUnit     = "systemd/inboxkeeper.service"
	onceUnit       = "systemd/inboxkeeper-once.service"
	onceTimer      = "systemd/inboxkeeper-once.timer"
	kubernetesDir  = "kubernetes"
	deployDocument = "../docs/operations/deploying.md"
	// recommendedInbox is the canonical recommended inbox layout, the one
	// the library's tests use (embedded as inbox.PlainDDL).
	recommendedInbox = "../inbox/schema/plain.sql"
)

// checkVariable fails unless name, an INBOXKEEPER_* variable, is one the
// daemon accepts: an unknown one makes it exit 2 before it connects.
func checkVariable(t *testing.T, where, name string) {
	t.Helper()
	if !strings.HasPrefix(strings.ToUpper(name), config.Prefix+"_") {
		return
	}
	if !slices.Contains(config.KnownVariables(), name) {
		t.Errorf("%s: %s is not a variable inboxkeeper knows (config.KnownVariables); the daemon would exit 2", where, name)
	}
}

func portOf(t *testing.T, where, addr string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%s: INBOXKEEPER_METRICS_ADDR %q: %v", where, addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatalf("%s: INBOXKEEPER_METRICS_ADDR %q: %v", where, addr, err)
	}
	return n
}

// checkPolicy parses a policy file as once, run and status do: the file, then
// its retention section.
func checkPolicy(t *testing.T, where string, data []byte) *policy.Policy {
	t.Helper()
	p, err := policy.Parse(data, where)
	if err != nil {
		t.Fatalf("%s: the policy file does not parse:\n%v", where, err)
	}
	plans, err := retention.Load(p)
	if err != nil {
		t.Fatalf("%s: the retention section does not plan:\n%v", where, err)
	}
	if len(p.Tables) == 0 || len(plans) == 0 {
		t.Fatalf("%s: want an example with tables and a retention section, got %d tables and %d plans", where, len(p.Tables), len(plans))
	}
	return p
}

// ---------------------------------------------------------------------------
// Kubernetes
// ---------------------------------------------------------------------------

type manifest struct {
	File       string
	APIVersion string            `yaml:"apiVersion"`
	Kind       string            `yaml:"kind"`
	Metadata   objectMeta        `yaml:"metadata"`
	Spec       yaml.Node         `yaml:"spec"`
	Data       map[string]string `yaml:"data"`
	StringData map[string]string `yaml:"stringData"`
	BinaryData map[string]string `yaml:"binaryData"`
}

func (m manifest) String() string { return fmt.Sprintf("%s: %s %s", m.File, m.Kind, m.Metadata.Name) }

type objectMeta struct {
	Name      string `yaml:"name"`
	Namespace string `yaml:"namespace"`
}

type podTemplate struct {
	Spec yaml.Node `yaml:"spec"`
}

type workloadSpec struct { // StatefulSet, Deployment, DaemonSet
	Template podTemplate `yaml:"template"`
}

type jobSpec struct {
	BackoffLimit     *int `yaml:"backoffLimit"`
	PodFailurePolicy *struct {
		Rules []struct {
			Action      string `yaml:"action"`
			OnExitCodes *struct {
				ContainerName string `yaml:"containerName"`
				Operator      string `yaml:"operator"`
				Values        []int  `yaml:"values"`
			} `yaml:"onExitCodes"`
		} `yaml:"rules"`
	} `yaml:"podFailurePolicy"`
	ActiveDeadlineSeconds *int        `yaml:"activeDeadlineSeconds"`
	Template              podTemplate `yaml:"template"`
}

type cronJobSpec struct {
	Schedule          string `yaml:"schedule"`
	ConcurrencyPolicy string `yaml:"concurrencyPolicy"`
	JobTemplate       struct {
		Spec yaml.Node `yaml:"spec"`
	} `yaml:"jobTemplate"`
}

type podSpec struct {
	RestartPolicy      string          `yaml:"restartPolicy"`
	EnableServiceLinks *bool           `yaml:"enableServiceLinks"`
	SecurityContext    securityContext `yaml:"securityContext"`
	InitContainers     []container     `yaml:"initContainers"`
	Containers         []container     `yaml:"containers"`
	Volumes            []volume        `yaml:"volumes"`
}

type container struct {
	Name           string          `yaml:"name"`
	Image          string          `yaml:"image"`
	Command        []string        `yaml:"command"`
	Args           []string        `yaml:"args"`
	RestartPolicy  string          `yaml:"restartPolicy"`
	Env            []envVar        `yaml:"env"`
	EnvFrom        []yaml.Node     `yaml:"envFrom"`
	Ports          []containerPort `yaml:"ports"`
	LivenessProbe  *probe          `yaml:"livenessProbe"`
	ReadinessProbe *probe          `yaml:"readinessProbe"`
	StartupProbe   *probe          `yaml:"startupProbe"`
	Resources      struct {
		Requests map[string]string `yaml:"requests"`
		Limits   map[string]string `yaml:"limits"`
	} `yaml:"resources"`
	SecurityContext securityContext `yaml:"securityContext"`
	VolumeMounts    []struct {
		Name      string `yaml:"name"`
		MountPath string `yaml:"mountPath"`
		SubPath   string `yaml:"subPath"`
		ReadOnly  bool   `yaml:"readOnly"`
	} `yaml:"volumeMounts"`
}

type containerPort struct {
	Name          string `yaml:"name"`
	ContainerPort int    `yaml:"containerPort"`
}

type envVar struct {
	Name      string  `yaml:"name"`
	Value     *string `yaml:"value"`
	ValueFrom *struct {
		SecretKeyRef *secretKeyRef `yaml:"secretKeyRef"`
	} `yaml:"valueFrom"`
}

type secretKeyRef struct {
	Name string `yaml:"name"`
	Key  string `yaml:"key"`
}

type probe struct {
	HTTPGet *struct {
		Path string    `yaml:"path"`
		Port yaml.Node `yaml:"port"` // a number or a port name
	} `yaml:"httpGet"`
}

type securityContext struct {
	RunAsNonRoot             *bool  `yaml:"runAsNonRoot"`
	RunAsUser                *int64 `yaml:"runAsUser"`
	AllowPrivilegeEscalation *bool  `yaml:"allowPrivilegeEscalation"`
	ReadOnlyRootFilesystem   *bool  `yaml:"readOnlyRootFilesystem"`
	Privileged               *bool  `yaml:"privileged"`
	Capabilities             *struct {
		Add  []string `yaml:"add"`
		Drop []string `yaml:"drop"`
	} `yaml:"capabilities"`
	SeccompProfile *struct {
		Type string `yaml:"type"`
	} `yaml:"seccompProfile"`
}

type volume struct {
	Name      string `yaml:"name"`
	ConfigMap *struct {
		Name  string `yaml:"name"`
		Items []struct {
			Key  string `yaml:"key"`
			Path string `yaml:"path"`
		} `yaml:"items"`
	} `yaml:"configMap"`
}

// pod is a pod template found in a manifest, with what owns it.
type pod struct {
	Owner    manifest
	Spec     podSpec
	SpecNode *yaml.Node
	Job      *jobSpec     // the Job, or the CronJob's job template
	CronJob  *cronJobSpec // the CronJob
}

func (p pod) String() string { return p.Owner.String() }

// Field names of the Kubernetes API objects the manifests spell out, so
// that a misspelt field (readinesProbe) fails here instead of being dropped
// by the API server's decoder with a warning nobody reads.
var (
	podSpecFields = []string{"volumes", "initContainers", "containers", "ephemeralContainers", "restartPolicy",
		"terminationGracePeriodSeconds", "activeDeadlineSeconds", "dnsPolicy", "nodeSelector", "serviceAccountName",
		"serviceAccount", "automountServiceAccountToken", "nodeName", "hostNetwork", "hostPID", "hostIPC",
		"shareProcessNamespace", "securityContext", "imagePullSecrets", "hostname", "subdomain", "affinity",
		"schedulerName", "tolerations", "hostAliases", "priorityClassName", "priority", "dnsConfig", "readinessGates",
		"runtimeClassName", "enableServiceLinks", "preemptionPolicy", "overhead", "topologySpreadConstraints",
		"setHostnameAsFQDN", "os", "hostUsers", "schedulingGates", "resourceClaims", "resources"}
	containerFields = []string{"name", "image", "command", "args", "workingDir", "ports", "envFrom", "env", "resources",
		"resizePolicy", "restartPolicy", "restartPolicyRules", "volumeMounts", "volumeDevices", "livenessProbe",
		"readinessProbe", "startupProbe", "lifecycle", "terminationMessagePath", "terminationMessagePolicy",
		"imagePullPolicy", "securityContext", "stdin", "stdinOnce", "tty"}
	securityContextFields = []string{"capabilities", "privileged", "seLinuxOptions", "windowsOptions", "runAsUser",
		"runAsGroup", "runAsNonRoot", "readOnlyRootFilesystem", "allowPrivilegeEscalation", "procMount",
		"seccompProfile", "appArmorProfile"}
	podSecurityContextFields = []string{"seLinuxOptions", "windowsOptions", "runAsUser", "runAsGroup", "runAsNonRoot",
		"supplementalGroups", "supplementalGroupsPolicy", "fsGroup", "sysctls", "fsGroupChangePolicy",
		"seccompProfile", "appArmorProfile", "seLinuxChangePolicy"}
	probeFields = []string{"exec", "httpGet", "tcpSocket", "grpc", "initialDelaySeconds", "timeoutSeconds",
		"periodSeconds", "successThreshold", "failureThreshold", "terminationGracePeriodSeconds"}
	envVarFields  = []string{"name", "value", "valueFrom"}
	jobSpecFields = []string{"parallelism", "completions", "activeDeadlineSeconds", "podFailurePolicy", "successPolicy",
		"backoffLimit", "backoffLimitPerIndex", "maxFailedIndexes", "selector", "manualSelector", "template",
		"ttlSecondsAfterFinished", "completionMode", "suspend", "podReplacementPolicy", "managedBy"}
	cronJobSpecFields = []string{"schedule", "timeZone", "startingDeadlineSeconds", "concurrencyPolicy", "suspend",
		"jobTemplate", "successfulJobsHistoryLimit", "failedJobsHistoryLimit"}
)

// checkFields reports keys of the mapping n that are not in known.
func checkFields(t *testing.T, where string, n *yaml.Node, known []string) {
	t.Helper()
	if n == nil || n.Kind != yaml.MappingNode {
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := n.Content[i].Value; !slices.Contains(known, k) {
			t.Errorf("%s: line %d: unknown field %q", where, n.Content[i].Line, k)
		}
	}
}

// field returns the value of key in the mapping n, or nil.
func field(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

func lintPodSpec(t *testing.T, where string, n *yaml.Node) {
	t.Helper()
	checkFields(t, where+": pod spec", n, podSpecFields)
	checkFields(t, where+": pod securityContext", field(n, "securityContext"), podSecurityContextFields)
	for _, list := range []string{"initContainers", "containers"} {
		cs := field(n, list)
		if cs == nil {
			continue
		}
		for i, c := range cs.Content {
			w := fmt.Sprintf("%s: %s[%d]", where, list, i)
			if name := field(c, "name"); name != nil {
				w = fmt.Sprintf("%s: %s[%s]", where, list, name.Value)
			}
			checkFields(t, w, c, containerFields)
			checkFields(t, w+": securityContext", field(c, "securityContext"), securityContextFields)
			for _, p := range []string{"livenessProbe", "readinessProbe", "startupProbe"} {
				checkFields(t, w+": "+p, field(c, p), probeFields)
			}
			if env := field(c, "env"); env != nil {
				for _, e := range env.Content {
					checkFields(t, w+": env", e, envVarFields)
				}
			}
		}
	}
}

// yamlDocuments decodes every document of a multi-document YAML file.
func yamlDocuments(t *testing.T, name string) []*yaml.Node {
	t.Helper()
	dec := yaml.NewDecoder(strings.NewReader(testfile.Read(t, name)))
	var docs []*yaml.Node
	for {
		var n yaml.Node
		err := dec.Decode(&n)
		if errors.Is(err, io.EOF) {
			return docs
		}
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(n.Content) > 0 && n.Content[0].Kind != yaml.ScalarNode { // skip empty documents
			docs = append(docs, n.Content[0])
		}
	}
}

type cluster struct {
	manifests  []manifest
	pods       []pod
	secrets    map[string]map[string]string
	configMaps map[string]map[string]string
}

func loadKubernetes(t *testing.T) cluster {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(kubernetesDir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests in %s: %v", kubernetesDir, err)
	}
	c := cluster{secrets: map[string]map[string]string{}, configMaps: map[string]map[string]string{}}
	for _, f := range files {
		for _, doc := range yamlDocuments(t, f) {
			var m manifest
			if err := doc.Decode(&m); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			m.File = f
			if m.APIVersion == "" || m.Kind == "" || m.Metadata.Name == "" {
				t.Errorf("%s: line %d: a manifest needs apiVersion, kind and metadata.name", f, doc.Line)
			}
			if m.Metadata.Namespace != "" {
				t.Errorf("%s: sets metadata.namespace; leave it to kubectl -n", m)
			}
			c.manifests = append(c.manifests, m)
			c.addPods(t, m)
		}
	}
	return c
}

func (c *cluster) addPods(t *testing.T, m manifest) {
	t.Helper()
	decode := func(n *yaml.Node, v any) {
		t.Helper()
		if err := n.Decode(v); err != nil {
			t.Fatalf("%s: %v", m, err)
		}
	}
	addPod := func(specNode *yaml.Node, job *jobSpec, cj *cronJobSpec) {
		t.Helper()
		p := pod{Owner: m, SpecNode: specNode, Job: job, CronJob: cj}
		decode(specNode, &p.Spec)
		lintPodSpec(t, m.String(), specNode)
		c.pods = append(c.pods, p)
	}
	switch m.Kind {
	case "Secret":
		if len(m.Data) > 0 || len(m.BinaryData) > 0 {
			t.Errorf("%s: use stringData with placeholders; base64 data hides whether a value is real", m)
		}
		c.secrets[m.Metadata.Name] = m.StringData
	case "ConfigMap":
		c.configMaps[m.Metadata.Name] = m.Data
	case "StatefulSet", "Deployment", "DaemonSet":
		var s workloadSpec
		decode(&m.Spec, &s)
		addPod(&s.Template.Spec, nil, nil)
	case "Job":
		var s jobSpec
		decode(&m.Spec, &s)
		checkFields(t, m.String()+": spec", &m.Spec, jobSpecFields)
		addPod(&s.Template.Spec, &s, nil)
	case "CronJob":
		var s cronJobSpec
		decode(&m.Spec, &s)
		checkFields(t, m.String()+": spec", &m.Spec, cronJobSpecFields)
		checkFields(t, m.String()+": jobTemplate.spec", &s.JobTemplate.Spec, jobSpecFields)
		var j jobSpec
		decode(&s.JobTemplate.Spec, &j)
		addPod(&j.Template.Spec, &j, &s)
	}
}

// inboxkeeperContainers returns the containers that run inboxkeeper.
func (p pod) inboxkeeperContainers() []container {
	var out []container
	for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
		if c.Name == "inboxkeeper" || strings.Contains(c.Image, "inboxkeeper/inboxkeeper") {
			out = append(out, c)
		}
	}
	return out
}

func (c container) env(name string) *envVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

// secretRef returns where the variable name comes from, or nil.
func (c container) secretRef(name string) *secretKeyRef {
	if e := c.env(name); e != nil && e.ValueFrom != nil {
		return e.ValueFrom.SecretKeyRef
	}
	return nil
}

func (c container) envValue(name string) string {
	if e := c.env(name); e != nil && e.Value != nil {
		return *e.Value
	}
	return ""
}

// findPod returns the single pod of file whose inboxkeeper container runs
// command.
func (c cluster) findPod(t *testing.T, command, file string) (pod, container) {
	t.Helper()
	var found []pod
	var cs []container
	for _, p := range c.pods {
		if p.Owner.File != filepath.Join(kubernetesDir, file) {
			continue
		}
		for _, ct := range p.inboxkeeperContainers() {
			if slices.Equal(ct.Args, []string{command}) {
				found = append(found, p)
				cs = append(cs, ct)
			}
		}
	}
	if len(found) != 1 {
		t.Fatalf("want exactly one manifest in %s running `inboxkeeper %s`, found %d: %v", file, command, len(found), found)
	}
	return found[0], cs[0]
}

func TestKubernetesManifests(t *testing.T) {
	t.Parallel()
	c := loadKubernetes(t)

	t.Run("every inboxkeeper container", func(t *testing.T) {
		n := 0
		for _, p := range c.pods {
			for _, ct := range p.inboxkeeperContainers() {
				n++
				checkInboxkeeperContainer(t, c, p, ct)
			}
		}
		if n != 4 {
			t.Errorf("want 4 inboxkeeper containers (sidecar, Deployment, CronJob, migrate Job), found %d", n)
		}
	})

	t.Run("sidecar", func(t *testing.T) {
		p, ct := c.findPod(t, "run", "sidecar.yaml")
		if p.Owner.Kind != "StatefulSet" {
			t.Errorf("`inboxkeeper run` is in %s, want the StatefulSet in sidecar.yaml", p)
		}
		if !slices.ContainsFunc(p.Spec.InitContainers, func(x container) bool { return x.Name == ct.Name }) || ct.RestartPolicy != "Always" {
			t.Errorf("%s: inboxkeeper must be a native sidecar: an initContainers entry with restartPolicy: Always (got restartPolicy %q)", p, ct.RestartPolicy)
		}
		if !slices.ContainsFunc(p.Spec.Containers, func(x container) bool { return strings.HasPrefix(x.Image, "postgres:") }) {
			t.Errorf("%s: the sidecar's pod has no postgres container", p)
		}
		checkRunContainer(t, p, ct)
	})

	t.Run("deployment", func(t *testing.T) {
		p, ct := c.findPod(t, "run", "deployment.yaml")
		if p.Owner.Kind != "Deployment" {
			t.Errorf("`inboxkeeper run` is in %s, want a Deployment in deployment.yaml", p)
		}
		if len(p.Spec.Containers) != 1 || len(p.Spec.InitContainers) != 0 {
			t.Errorf("%s: want inboxkeeper alone in its pod", p)
		}
		if ref := ct.secretRef("INBOXKEEPER_DATABASE_URL"); ref == nil || ref.Key != "database-url" {
			t.Errorf("%s: want INBOXKEEPER_DATABASE_URL from the Secret's database-url key (a Service or endpoint, not loopback)", p)
		}
		checkRunContainer(t, p, ct)
	})

	t.Run("cronjob", func(t *testing.T) {
		p, ct := c.findPod(t, "once", "cronjob.yaml")
		checkOncePod(t, p, ct)
	})

	t.Run("migrate job", func(t *testing.T) {
		p, ct := c.findPod(t, "migrate", "migrate-job.yaml")
		if p.Owner.Kind != "Job" || p.CronJob != nil {
			t.Errorf("`inboxkeeper migrate` is in %s, want a Job", p)
		}
		if p.Spec.RestartPolicy != "OnFailure" && p.Spec.RestartPolicy != "Never" {
			t.Errorf("%s: restartPolicy = %q, want OnFailure or Never", p, p.Spec.RestartPolicy)
		}
		// migrate runs as the owner, the daemon as the limited role: two
		// different credentials.
		mk := ct.secretRef("INBOXKEEPER_DATABASE_URL")
		if mk == nil {
			t.Fatalf("%s: INBOXKEEPER_DATABASE_URL is not from a Secret", p)
		}
		for _, other := range []container{c.must(t, "run", "sidecar.yaml"), c.must(t, "run", "deployment.yaml"), c.must(t, "once", "cronjob.yaml")} {
			if ok := other.secretRef("INBOXKEEPER_DATABASE_URL"); ok != nil && *ok == *mk {
				t.Errorf("%s: migrate and the daemon share the secret key %s/%s; migrate should run as the owner, the daemon as the limited role", p, mk.Name, mk.Key)
			}
		}
	})

	t.Run("secrets are placeholders", func(t *testing.T) {
		if len(c.secrets) == 0 {
			t.Fatal("no Secret in the manifests")
		}
		for name, data := range c.secrets {
			for k, v := range data {
				if !strings.Contains(v, "CHANGE_ME") {
					t.Errorf("Secret %s key %s: %q does not look like a placeholder (want CHANGE_ME in it)", name, k, v)
				}
			}
		}
	})

	t.Run("policy configmap", func(t *testing.T) {
		n := 0
		for name, data := range c.configMaps {
			for key, body := range data {
				if !strings.HasSuffix(key, ".yaml") {
					continue
				}
				n++
				checkPolicy(t, fmt.Sprintf("ConfigMap %s key %s", name, key), []byte(body))
				if body != testfile.Read(t, policyExample) {
					t.Errorf("ConfigMap %s key %s differs from %s; keep the two examples equal", name, key, policyExample)
				}
			}
		}
		if n != 1 {
			t.Errorf("want one policy file in a ConfigMap, found %d", n)
		}
	})
}

func (c cluster) must(t *testing.T, command, file string) container {
	t.Helper()
	_, ct := c.findPod(t, command, file)
	return ct
}

// checkRunContainer checks what `inboxkeeper run` needs in any pod: a
// metrics listener the kubelet reaches, probes on it, and small resources.
func checkRunContainer(t *testing.T, p pod, ct container) {
	t.Helper()
	addr := ct.envValue("INBOXKEEPER_METRICS_ADDR")
	if addr == "" {
		t.Fatalf("%s: `run` needs INBOXKEEPER_METRICS_ADDR for its probes", p)
	}
	host, _, _ := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		t.Errorf("%s: INBOXKEEPER_METRICS_ADDR=%s: the kubelet probes the pod IP, so listen on 0.0.0.0 (or [::])", p, addr)
	}
	port := portOf(t, p.String(), addr)
	if !slices.ContainsFunc(ct.Ports, func(cp containerPort) bool { return cp.ContainerPort == port }) {
		t.Errorf("%s: no containerPort %d for the metrics listener", p, port)
	}
	for _, pr := range []struct {
		name, path string
		probe      *probe
	}{{"livenessProbe", "/livez", ct.LivenessProbe}, {"readinessProbe", "/readyz", ct.ReadinessProbe}} {
		if pr.probe == nil || pr.probe.HTTPGet == nil {
			t.Errorf("%s: want a %s with httpGet %s", p, pr.name, pr.path)
			continue
		}
		if pr.probe.HTTPGet.Path != pr.path {
			t.Errorf("%s: %s.httpGet.path = %q, want %q", p, pr.name, pr.probe.HTTPGet.Path, pr.path)
		}
		if got := resolvePort(ct, pr.probe.HTTPGet.Port); got != port {
			t.Errorf("%s: %s probes port %d, but INBOXKEEPER_METRICS_ADDR listens on %d", p, pr.name, got, port)
		}
	}
	if ct.StartupProbe != nil {
		t.Errorf("%s: a startupProbe on a native sidecar holds back the database container until it passes", p)
	}
	want := map[string]string{"requests.cpu": "10m", "requests.memory": "32Mi", "limits.memory": "128Mi"}
	got := map[string]string{"requests.cpu": ct.Resources.Requests["cpu"], "requests.memory": ct.Resources.Requests["memory"],
		"limits.memory": ct.Resources.Limits["memory"]}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: resources.%s = %q, want %q", p, k, got[k], v)
		}
	}
	if _, ok := ct.Resources.Limits["cpu"]; ok {
		t.Errorf("%s: no CPU limit on the daemon: throttling it stretches batches, which hold row locks longer", p)
	}
}

// checkOncePod checks the CronJob that runs `inboxkeeper once`.
func checkOncePod(t *testing.T, p pod, ct container) {
	t.Helper()
	if p.CronJob == nil {
		t.Fatalf("`inboxkeeper once` is in %s, want a CronJob", p)
	}
	cj := p.CronJob
	if cj.ConcurrencyPolicy != "Forbid" {
		t.Errorf("%s: concurrencyPolicy = %q, want Forbid", p, cj.ConcurrencyPolicy)
	}
	sched, err := cron.ParseStandard(cj.Schedule)
	if err != nil {
		t.Fatalf("%s: schedule %q: %v", p, cj.Schedule, err)
	}
	// Exit 1 (a table failed) is worth a retry, exit 2 (fix the
	// configuration) is not: only a podFailurePolicy tells them apart,
	// and it needs restartPolicy Never.
	if p.Spec.RestartPolicy != "Never" {
		t.Errorf("%s: restartPolicy = %q, want Never (podFailurePolicy needs it)", p, p.Spec.RestartPolicy)
	}
	if p.Job.BackoffLimit == nil || *p.Job.BackoffLimit > 3 {
		t.Errorf("%s: want a small backoffLimit (at most 3)", p)
	}
	failsOnExit2 := false
	if pfp := p.Job.PodFailurePolicy; pfp != nil {
		for _, r := range pfp.Rules {
			if e := r.OnExitCodes; r.Action == "FailJob" && e != nil && e.Operator == "In" && slices.Contains(e.Values, 2) &&
				(e.ContainerName == "" || e.ContainerName == ct.Name) {
				failsOnExit2 = true
			}
			if e := r.OnExitCodes; e != nil && r.Action != "FailJob" && e.Operator == "In" && slices.Contains(e.Values, 2) {
				t.Errorf("%s: podFailurePolicy %s on exit 2; a configuration error must fail the Job", p, r.Action)
			}
		}
	}
	if !failsOnExit2 {
		t.Errorf("%s: want a podFailurePolicy rule FailJob onExitCodes In [2]: exit 2 is a configuration error, a retry will not fix it", p)
	}
	// A pass must end before the next one is due: RUN_TIME stops it
	// cleanly, activeDeadlineSeconds kills it after that.
	first := sched.Next(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	every := sched.Next(first).Sub(first)
	runTime, err := time.ParseDuration(ct.envValue("INBOXKEEPER_RUN_TIME"))
	if err != nil || runTime <= 0 {
		t.Fatalf("%s: want INBOXKEEPER_RUN_TIME set, below the schedule's %s: %v", p, every, err)
	}
	if p.Job.ActiveDeadlineSeconds == nil {
		t.Fatalf("%s: want activeDeadlineSeconds", p)
	}
	deadline := time.Duration(*p.Job.ActiveDeadlineSeconds) * time.Second
	if !(runTime < deadline && deadline < every) {
		t.Errorf("%s: want INBOXKEEPER_RUN_TIME (%s) < activeDeadlineSeconds (%s) < the schedule's interval (%s)", p, runTime, deadline, every)
	}
}

func resolvePort(c container, n yaml.Node) int {
	if v, err := strconv.Atoi(n.Value); err == nil {
		return v
	}
	for _, p := range c.Ports {
		if p.Name == n.Value {
			return p.ContainerPort
		}
	}
	return -1
}

func checkInboxkeeperContainer(t *testing.T, c cluster, p pod, ct container) {
	t.Helper()
	where := fmt.Sprintf("%s: container %s", p, ct.Name)
	if ct.Image != image {
		t.Errorf("%s: image %q, want %q", where, ct.Image, image)
	}
	if len(ct.Command) > 0 {
		t.Errorf("%s: command %q overrides the image's ENTRYPOINT; set args only", where, ct.Command)
	}
	command := ""
	if len(ct.Args) == 1 {
		command = ct.Args[0]
	}
	if !slices.Contains([]string{"run", "once", "migrate"}, command) {
		t.Errorf("%s: args %q, want one of run, once, migrate", where, ct.Args)
	}
	if p.Spec.EnableServiceLinks == nil || *p.Spec.EnableServiceLinks {
		t.Errorf("%s: set enableServiceLinks: false; a Service named inboxkeeper-metrics would inject INBOXKEEPER_METRICS_SERVICE_HOST and the like, which inboxkeeper rejects as unknown (exit 2)", p)
	}
	if len(ct.EnvFrom) > 0 {
		t.Errorf("%s: envFrom hides which variables are set; list them in env", where)
	}

	// The environment.
	seen := map[string]bool{}
	for _, e := range ct.Env {
		if seen[e.Name] {
			t.Errorf("%s: %s set twice", where, e.Name)
		}
		seen[e.Name] = true
		checkVariable(t, where, e.Name)
		if e.Value != nil && (strings.Contains(*e.Value, "://") || strings.Contains(*e.Value, "password")) {
			t.Errorf("%s: %s has a literal connection string; take it from a Secret", where, e.Name)
		}
	}
	db := ct.env("INBOXKEEPER_DATABASE_URL")
	switch {
	case db == nil:
		t.Errorf("%s: no INBOXKEEPER_DATABASE_URL", where)
	case db.Value != nil || db.ValueFrom == nil || db.ValueFrom.SecretKeyRef == nil:
		t.Errorf("%s: INBOXKEEPER_DATABASE_URL must come from a secretKeyRef, never a literal value", where)
	default:
		ref := db.ValueFrom.SecretKeyRef
		if _, ok := c.secrets[ref.Name][ref.Key]; !ok {
			t.Errorf("%s: INBOXKEEPER_DATABASE_URL refers to Secret %s key %s, which secret.example.yaml does not define", where, ref.Name, ref.Key)
		}
	}
	if got := ct.envValue("INBOXKEEPER_LOG_FORMAT"); got != "json" {
		t.Errorf("%s: INBOXKEEPER_LOG_FORMAT = %q, want json", where, got)
	}
	// migrate too: it creates a tiered policy's permanent key tables.
	checkPolicyMount(t, c, p, ct, where)

	// The restricted security context; the pod's applies where the
	// container's is silent.
	sc, psc := ct.SecurityContext, p.Spec.SecurityContext
	isTrue := func(b ...*bool) bool {
		for _, v := range b {
			if v != nil {
				return *v
			}
		}
		return false
	}
	if !isTrue(sc.RunAsNonRoot, psc.RunAsNonRoot) {
		t.Errorf("%s: want runAsNonRoot: true", where)
	}
	if u := sc.RunAsUser; u == nil || *u != 65532 {
		t.Errorf("%s: want runAsUser: 65532 (distroless nonroot)", where)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: want allowPrivilegeEscalation: false", where)
	}
	if !isTrue(sc.ReadOnlyRootFilesystem) {
		t.Errorf("%s: want readOnlyRootFilesystem: true", where)
	}
	if isTrue(sc.Privileged) {
		t.Errorf("%s: privileged", where)
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []string{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("%s: want capabilities: drop [ALL], add nothing", where)
	}
	seccomp := sc.SeccompProfile
	if seccomp == nil {
		seccomp = psc.SeccompProfile
	}
	if seccomp == nil || seccomp.Type != "RuntimeDefault" {
		t.Errorf("%s: want seccompProfile RuntimeDefault", where)
	}
	if ct.Resources.Requests["cpu"] == "" || ct.Resources.Requests["memory"] == "" || ct.Resources.Limits["memory"] == "" {
		t.Errorf("%s: want cpu and memory requests and a memory limit", where)
	}
}

// checkPolicyMount checks that INBOXKEEPER_POLICY_FILE names a file that a
// ConfigMap volume puts there, and that the ConfigMap holds it.
func checkPolicyMount(t *testing.T, c cluster, p pod, ct container, where string) {
	t.Helper()
	file := ct.envValue("INBOXKEEPER_POLICY_FILE")
	if !path.IsAbs(file) {
		t.Errorf("%s: INBOXKEEPER_POLICY_FILE = %q, want an absolute path into a ConfigMap volume", where, file)
		return
	}
	for _, m := range ct.VolumeMounts {
		if m.MountPath != path.Dir(file) || m.SubPath != "" {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("%s: mount the policy read-only", where)
		}
		for _, v := range p.Spec.Volumes {
			if v.Name != m.Name || v.ConfigMap == nil {
				continue
			}
			data, ok := c.configMaps[v.ConfigMap.Name]
			if !ok {
				t.Errorf("%s: volume %s names ConfigMap %s, which configmap.yaml does not define", where, v.Name, v.ConfigMap.Name)
				return
			}
			key := path.Base(file)
			for _, it := range v.ConfigMap.Items {
				if it.Path == path.Base(file) {
					key = it.Key
				}
			}
			if _, ok := data[key]; !ok {
				t.Errorf("%s: ConfigMap %s has no key %s for %s", where, v.ConfigMap.Name, key, file)
			}
			return
		}
	}
	t.Errorf("%s: INBOXKEEPER_POLICY_FILE=%s, but no ConfigMap volume is mounted at %s", where, file, path.Dir(file))
}

// ---------------------------------------------------------------------------
// systemd
// ---------------------------------------------------------------------------

type unitFile struct {
	name     string
	sections map[string][][2]string // section -> ordered key/value pairs
}

// parseUnit reads a systemd unit file: [Section] headers, Key=Value lines,
// '#' and ';' comments, and backslash continuations.
func parseUnit(t *testing.T, name string) unitFile {
	t.Helper()
	u := unitFile{name: name, sections: map[string][][2]string{}}
	section := ""
	var pending string
	for i, line := range strings.Split(testfile.Read(t, name), "\n") {
		line = strings.TrimSpace(line)
		if pending != "" {
			line, pending = pending+" "+line, ""
		}
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		if strings.HasSuffix(line, `\`) {
			pending = strings.TrimSuffix(line, `\`)
			continue
		}
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			section = line[1 : len(line)-1]
			if _, dup := u.sections[section]; dup {
				t.Errorf("%s:%d: section [%s] twice", name, i+1, section)
			}
			u.sections[section] = nil
			continue
		}
		k, v, ok := strings.Cut(line, "=")
		if !ok || section == "" {
			t.Fatalf("%s:%d: not a Key=Value line in a section: %q", name, i+1, line)
		}
		u.sections[section] = append(u.sections[section], [2]string{strings.TrimSpace(k), strings.TrimSpace(v)})
	}
	return u
}

// get returns the last value of key in section ("" when unset), as systemd
// lets a later assignment win.
func (u unitFile) get(section, key string) string {
	v := ""
	for _, kv := range u.sections[section] {
		if kv[0] == key {
			v = kv[1]
		}
	}
	return v
}

func (u unitFile) all(section, key string) []string {
	var vs []string
	for _, kv := range u.sections[section] {
		if kv[0] == key {
			vs = append(vs, kv[1])
		}
	}
	return vs
}

// sandbox is the unit's [Service] settings other than what it runs.
func (u unitFile) sandbox() map[string]string {
	skip := []string{"Type", "ExecStart", "ExecReload", "Environment", "EnvironmentFile", "Restart", "RestartSec",
		"RestartPreventExitStatus", "KillSignal", "TimeoutStopSec", "TimeoutStartSec",
		"RuntimeDirectory", "RuntimeDirectoryPreserve", "RuntimeDirectoryMode", "ReadWritePaths"}
	m := map[string]string{}
	for _, kv := range u.sections["Service"] {
		if !slices.Contains(skip, kv[0]) {
			m[kv[0]] += kv[1] + "\n"
		}
	}
	return m
}

func TestSystemdUnits(t *testing.T) {
	t.Parallel()
	daemon, once, timer := parseUnit(t, daemonUnit), parseUnit(t, onceUnit), parseUnit(t, onceTimer)
	const bin = "/usr/local/bin/inboxkeeper"
	envFile := "/etc/inboxkeeper/inboxkeeper.env"

	want := []struct {
		u                 unitFile
		section, key, val string
	}{
		{daemon, "Service", "Type", "exec"},
		{daemon, "Service", "ExecStart", bin + " run"},
		{daemon, "Service", "EnvironmentFile", envFile},
		{daemon, "Service", "Restart", "on-failure"},
		{daemon, "Service", "RestartSec", "5s"},
		{daemon, "Service", "RestartPreventExitStatus", "2"},
		// run applies the policy file on SIGHUP (cmd/inboxkeeper TestReload).
		{daemon, "Service", "ExecReload", "/bin/kill -HUP $MAINPID"},
		{daemon, "Install", "WantedBy", "multi-user.target"},
		{once, "Service", "Type", "oneshot"},
		{once, "Service", "ExecStart", bin + " once --metrics-file " + onceMetricsFile},
		{once, "Service", "EnvironmentFile", envFile},
		{timer, "Timer", "Unit", filepath.Base(onceUnit)},
		{timer, "Timer", "OnCalendar", "*:0/10"},
		{timer, "Timer", "Persistent", "true"},
		{timer, "Install", "WantedBy", "timers.target"},
	}
	for _, w := range want {
		if got := w.u.get(w.section, w.key); got != w.val {
			t.Errorf("%s: [%s] %s=%q, want %q", w.u.name, w.section, w.key, got, w.val)
		}
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(onceTimer), timer.get("Timer", "Unit"))); err != nil {
		t.Errorf("%s: Unit=%s: %v", onceTimer, timer.get("Timer", "Unit"), err)
	}
	if _, ok := once.sections["Install"]; ok {
		t.Errorf("%s: the timer starts it; an [Install] section would let someone enable it on its own", onceUnit)
	}
	for _, u := range []unitFile{daemon, once} {
		if len(u.all("Service", "ExecStart")) != 1 {
			t.Errorf("%s: want exactly one ExecStart", u.name)
		}
		for k, v := range map[string]string{"DynamicUser": "yes", "NoNewPrivileges": "yes", "ProtectSystem": "strict",
			"ProtectHome": "yes", "PrivateTmp": "yes", "CapabilityBoundingSet": ""} {
			if got := u.all("Service", k); len(got) == 0 || got[len(got)-1] != v {
				t.Errorf("%s: want %s=%s, got %q", u.name, k, v, got)
			}
		}
		for _, e := range u.all("Service", "Environment") {
			for _, assignment := range strings.Fields(strings.Trim(e, `"`)) {
				name, _, _ := strings.Cut(assignment, "=")
				checkVariable(t, u.name, name)
			}
		}
	}
	checkWritable(t, once, path.Dir(onceMetricsFile))
	if !mapsEqual(daemon.sandbox(), once.sandbox()) {
		t.Errorf("%s and %s have different sandboxes:\n%v\n%v", daemonUnit, onceUnit, daemon.sandbox(), once.sandbox())
	}
}

// onceMetricsFile is where inboxkeeper-once.service leaves the pass's
// metrics for the node_exporter's textfile collector, as
// docs/reference/commands.md recommends for a timer.
const onceMetricsFile = "/run/inboxkeeper/inboxkeeper.prom"

// checkWritable fails unless the unit, under ProtectSystem=strict and a
// dynamic user, can create files in dir and leaves them there after it
// stops, readable by the collector: dir is a RuntimeDirectory= kept with
// RuntimeDirectoryPreserve=yes (systemd creates it for the dynamic user;
// without Preserve it is removed, the file with it, as the oneshot ends),
// or lies under a ReadWritePaths= entry.
func checkWritable(t *testing.T, u unitFile, dir string) {
	t.Helper()
	for _, rd := range u.all("Service", "RuntimeDirectory") {
		for _, name := range strings.Fields(rd) {
			if "/run/"+name != dir {
				continue
			}
			if p := u.get("Service", "RuntimeDirectoryPreserve"); p != "yes" {
				t.Errorf("%s: RuntimeDirectoryPreserve=%q: systemd removes %s, and the metrics file in it, when the pass ends; want yes", u.name, p, dir)
			}
			if m := u.get("Service", "RuntimeDirectoryMode"); m != "" && m != "0755" {
				t.Errorf("%s: RuntimeDirectoryMode=%s: the node_exporter must read %s", u.name, m, dir)
			}
			return
		}
	}
	for _, rw := range u.all("Service", "ReadWritePaths") {
		for _, p := range strings.Fields(rw) {
			if p = strings.TrimPrefix(p, "-"); dir == p || strings.HasPrefix(dir, strings.TrimSuffix(p, "/")+"/") {
				return
			}
		}
	}
	t.Errorf("%s: ProtectSystem=%s leaves %s read-only: --metrics-file cannot be written (want RuntimeDirectory= or ReadWritePaths= for it)",
		u.name, u.get("Service", "ProtectSystem"), dir)
}

func mapsEqual(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if bv, ok := b[k]; !ok || bv != v {
			return false
		}
	}
	return true
}

// The environment file lists every variable, each with a value inboxkeeper
// accepts (commented-out lines show the defaults).
func TestSystemdEnvExample(t *testing.T) {
	// Not parallel: it sets the environment for config.Load.
	assign := regexp.MustCompile(`^#?\s*(INBOXKEEPER_[A-Z0-9_]+)=(.*)$`)
	mention := regexp.MustCompile(`INBOXKEEPER_[A-Z0-9_]+`)
	values := map[string]string{}
	for i, line := range strings.Split(testfile.Read(t, envExample), "\n") {
		for _, name := range mention.FindAllString(line, -1) {
			checkVariable(t, fmt.Sprintf("%s:%d", envExample, i+1), name)
		}
		if m := assign.FindStringSubmatch(line); m != nil {
			if _, dup := values[m[1]]; dup {
				t.Errorf("%s:%d: %s twice", envExample, i+1, m[1])
			}
			values[m[1]] = m[2]
		}
	}
	for _, v := range config.Variables() { // the tests' and the demo's are not the daemon's
		name := v.Name
		if _, ok := values[name]; !ok {
			t.Errorf("%s: %s is missing; list every variable (commented out at its default)", envExample, name)
		}
	}
	if !strings.Contains(values["INBOXKEEPER_DATABASE_URL"], "CHANGE_ME") {
		t.Errorf("%s: INBOXKEEPER_DATABASE_URL should be an obvious placeholder (CHANGE_ME)", envExample)
	}
	for _, kv := range os.Environ() {
		if name, _, _ := strings.Cut(kv, "="); strings.HasPrefix(name, "INBOXKEEPER_") {
			t.Setenv(name, "")
			os.Unsetenv(name)
		}
	}
	for name, v := range values {
		t.Setenv(name, v)
	}
	if _, err := config.Load(); err != nil {
		t.Errorf("%s: inboxkeeper rejects these values:\n%v", envExample, err)
	}
}

// ---------------------------------------------------------------------------
// Docker
// ---------------------------------------------------------------------------

type instruction struct {
	line int
	cmd  string // upper case
	args string
}

// parseDockerfile splits a Dockerfile into instructions, joining
// continuation lines and dropping comments.
func parseDockerfile(t *testing.T, name string) []instruction {
	t.Helper()
	var out []instruction
	var cur *instruction
	for i, line := range strings.Split(testfile.Read(t, name), "\n") {
		trim := strings.TrimSpace(line)
		if strings.HasPrefix(trim, "#") || (trim == "" && cur == nil) {
			continue
		}
		if cur == nil {
			cmd, args, _ := strings.Cut(trim, " ")
			cur = &instruction{line: i + 1, cmd: strings.ToUpper(cmd)}
			trim = strings.TrimSpace(args)
		}
		more := strings.HasSuffix(trim, `\`)
		cur.args += strings.TrimSuffix(trim, `\`)
		if more {
			cur.args += " "
			continue
		}
		out = append(out, *cur)
		cur = nil
	}
	return out
}

func TestDockerfile(t *testing.T) {
	t.Parallel()
	ins := parseDockerfile(t, dockerfile)
	var froms []instruction
	args := map[string]string{}
	for _, in := range ins {
		switch in.cmd {
		case "FROM":
			froms = append(froms, in)
		case "ARG":
			if k, v, ok := strings.Cut(in.args, "="); ok && len(froms) == 0 {
				args[k] = v
			}
		}
	}
	if len(froms) < 2 {
		t.Fatalf("%s: want a multi-stage build (a build stage and a runtime stage), found %d FROM", dockerfile, len(froms))
	}
	expand := func(s string) string {
		return os.Expand(s, func(k string) string { return args[k] })
	}

	// The build stage: the Go of go.mod, a static binary, the version.
	build := expand(froms[0].args)
	goMod := testfile.Read(t, "../go.mod")
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(goMod)
	if goVersion == nil || !strings.Contains(build, "golang:"+goVersion[1]) {
		t.Errorf("%s:%d: build stage %q, want golang:%s as in go.mod", dockerfile, froms[0].line, build, goVersion)
	}
	var buildRun, copyFrom instruction
	for _, in := range ins {
		if in.cmd == "RUN" && strings.Contains(in.args, "go build") {
			buildRun = in
		}
		if in.cmd == "COPY" && strings.Contains(in.args, "--from=") {
			copyFrom = in
		}
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X main.version=${VERSION}", "-X main.revision=${REVISION}", "./cmd/inboxkeeper"} {
		if !strings.Contains(buildRun.args, want) {
			t.Errorf("%s: the go build step lacks %q: %q", dockerfile, want, buildRun.args)
		}
	}
	// The linker ignores -X for a variable that does not exist: make sure
	// it does.
	for _, v := range []string{"version", "revision"} {
		if !regexp.MustCompile(`(?m)^\s*(var )?` + v + `\s+= ""`).MatchString(testfile.Read(t, "../cmd/inboxkeeper/main.go")) {
			t.Errorf("%s: -X main.%s, but cmd/inboxkeeper/main.go has no package-level string variable %s", dockerfile, v, v)
		}
	}
	out := regexp.MustCompile(`-o (\S+)`).FindStringSubmatch(buildRun.args)
	if out == nil || !strings.Contains(copyFrom.args, out[1]) {
		t.Errorf("%s: the runtime stage copies %q, but the build writes %v", dockerfile, copyFrom.args, out)
	}

	// The runtime stage: non-root, the binary as ENTRYPOINT, run by default.
	final := froms[len(froms)-1]
	user := ""
	var entrypoint, cmd []string
	env := map[string]string{}
	exposed := []string{}
	for _, in := range ins {
		if in.line < final.line {
			continue
		}
		switch in.cmd {
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			if err := json.Unmarshal([]byte(in.args), &entrypoint); err != nil {
				t.Errorf("%s:%d: ENTRYPOINT must be in exec form (a JSON array), so signals reach inboxkeeper: %v", dockerfile, in.line, err)
			}
		case "CMD":
			if err := json.Unmarshal([]byte(in.args), &cmd); err != nil {
				t.Errorf("%s:%d: CMD must be in exec form: %v", dockerfile, in.line, err)
			}
		case "ENV":
			for _, kv := range strings.Fields(in.args) {
				k, v, _ := strings.Cut(kv, "=")
				env[k] = v
				checkVariable(t, dockerfile, k)
			}
		case "EXPOSE":
			exposed = append(exposed, strings.Fields(in.args)...)
		}
	}
	nonrootBase := strings.Contains(final.args, "distroless") && strings.HasSuffix(final.args, ":nonroot")
	uid, _, _ := strings.Cut(user, ":")
	if (user == "" && !nonrootBase) || uid == "0" || uid == "root" {
		t.Errorf("%s: the runtime stage (%s) must run as a non-root user; USER %q", dockerfile, final.args, user)
	}
	if uid != "" && uid != "65532" && uid != "nonroot" {
		t.Errorf("%s: USER %s, but the Kubernetes manifests run as 65532", dockerfile, user)
	}
	if len(entrypoint) != 1 || copyFrom.args == "" || !strings.HasSuffix(copyFrom.args, " "+entrypoint[0]) {
		t.Errorf("%s: ENTRYPOINT %q should be the binary the runtime stage copies (%s)", dockerfile, entrypoint, copyFrom.args)
	}
	if !slices.Equal(cmd, []string{"run"}) {
		t.Errorf("%s: CMD %q, want [\"run\"]", dockerfile, cmd)
	}
	port := portOf(t, dockerfile, env["INBOXKEEPER_METRICS_ADDR"])
	if !slices.Contains(exposed, strconv.Itoa(port)) {
		t.Errorf("%s: EXPOSE %v, but INBOXKEEPER_METRICS_ADDR listens on %d", dockerfile, exposed, port)
	}
}

// The ignore file must keep out nothing the binary is built from: the Go
// files of every package of the module that cmd/inboxkeeper imports, and
// their embedded files.
func TestDockerignoreKeepsTheSources(t *testing.T) {
	t.Parallel()
	var patterns []string
	for _, line := range strings.Split(testfile.Read(t, dockerignore), "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			if strings.HasPrefix(line, "!") {
				t.Fatalf("%s: the test's matcher does not handle exceptions (%s)", dockerignore, line)
			}
			patterns = append(patterns, path.Clean(line))
		}
	}
	cmd := exec.Command(goTool(t), "list", "-deps", "-f",
		`{{if .Module}}{{if .Module.Main}}{{.Dir}}{{range .GoFiles}} {{.}}{{end}}{{range .EmbedFiles}} {{.}}{{end}}{{end}}{{end}}`,
		"./cmd/inboxkeeper")
	cmd.Dir = ".."
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"go.mod", "go.sum"}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		dir, err := filepath.Rel(root, fields[0])
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fields[1:] {
			files = append(files, filepath.ToSlash(filepath.Join(dir, f)))
		}
	}
	if len(files) < 10 {
		t.Fatalf("go list found only %v", files)
	}
	for _, f := range files {
		for _, p := range patterns {
			if dockerignoreMatches(p, f) {
				t.Errorf("%s: pattern %q keeps %s out of the build context", dockerignore, p, f)
			}
		}
	}
}

// dockerignoreMatches applies one ignore pattern as Docker does, for the
// patterns used here: a pattern matches a path or any of its parent
// directories, and "**" matches any number of directories.
func dockerignoreMatches(pattern, name string) bool {
	parts := strings.Split(name, "/")
	for i := 1; i <= len(parts); i++ {
		prefix := strings.Join(parts[:i], "/")
		if ok, _ := path.Match(pattern, prefix); ok {
			return true
		}
		if rest, ok := strings.CutPrefix(pattern, "**/"); ok {
			for j := 0; j < i; j++ {
				if ok, _ := path.Match(rest, strings.Join(parts[j:i], "/")); ok {
					return true
				}
			}
		}
	}
	return false
}

type composeService struct {
	Image string `yaml:"image"`
	Build *struct {
		Context    string `yaml:"context"`
		Dockerfile string `yaml:"dockerfile"`
	} `yaml:"build"`
	Command     []string             `yaml:"command"`
	Environment yaml.Node            `yaml:"environment"`
	Volumes     []string             `yaml:"volumes"`
	Ports       []string             `yaml:"ports"`
	DependsOn   map[string]dependsOn `yaml:"depends_on"`
	Healthcheck *struct {
		Test []string `yaml:"test"`
	} `yaml:"healthcheck"`
	User string `yaml:"user"`
}

type dependsOn struct {
	Condition string `yaml:"condition"`
}

// env reads environment: as a map or as a list of NAME=value.
func (s composeService) env(t *testing.T) map[string]string {
	t.Helper()
	m := map[string]string{}
	switch s.Environment.Kind {
	case 0:
	case yaml.MappingNode:
		if err := s.Environment.Decode(&m); err != nil {
			t.Fatal(err)
		}
	case yaml.SequenceNode:
		var list []string
		if err := s.Environment.Decode(&list); err != nil {
			t.Fatal(err)
		}
		for _, kv := range list {
			k, v, _ := strings.Cut(kv, "=")
			m[k] = v
		}
	}
	return m
}

// readCompose is the compose example's services, by name.
func readCompose(t *testing.T) map[string]composeService {
	t.Helper()
	var file struct {
		Services map[string]composeService `yaml:"services"`
	}
	if err := yaml.Unmarshal([]byte(testfile.Read(t, composeFile)), &file); err != nil {
		t.Fatalf("%s: %v", composeFile, err)
	}
	return file.Services
}

func TestCompose(t *testing.T) {
	t.Parallel()
	services := readCompose(t)
	dir := filepath.Dir(composeFile)
	svc := func(name string) composeService {
		t.Helper()
		s, ok := services[name]
		if !ok {
			t.Fatalf("%s: no service %s", composeFile, name)
		}
		return s
	}
	pg, migrate, daemon := svc("postgres"), svc("migrate"), svc("inboxkeeper")

	if !strings.HasPrefix(pg.Image, "postgres:") || pg.Healthcheck == nil || len(pg.Healthcheck.Test) == 0 {
		t.Errorf("%s: postgres needs a postgres image and a healthcheck", composeFile)
	}
	for name, s := range services {
		for k := range s.env(t) {
			checkVariable(t, composeFile+": "+name, k)
		}
		for dep, d := range s.DependsOn {
			if _, ok := services[dep]; !ok {
				t.Errorf("%s: %s depends on unknown service %s", composeFile, name, dep)
			}
			if d.Condition == "" {
				t.Errorf("%s: %s depends on %s without a condition", composeFile, name, dep)
			}
		}
		for _, v := range s.Volumes {
			src, _, _ := strings.Cut(v, ":")
			if strings.HasPrefix(src, ".") {
				if _, err := os.Stat(filepath.Join(dir, src)); err != nil {
					t.Errorf("%s: %s mounts %s: %v", composeFile, name, src, err)
				}
			}
		}
	}
	for name, want := range map[string]struct {
		s    composeService
		args []string
		deps map[string]string
	}{
		"migrate":     {migrate, []string{"migrate"}, map[string]string{"postgres": "service_healthy"}},
		"inboxkeeper": {daemon, []string{"run"}, map[string]string{"postgres": "service_healthy", "migrate": "service_completed_successfully"}},
	} {
		s := want.s
		abs := func(p string) string {
			a, err := filepath.Abs(p)
			if err != nil {
				t.Fatal(err)
			}
			return a
		}
		if s.Image != image {
			t.Errorf("%s: %s runs %q, want %q", composeFile, name, s.Image, image)
		}
		if s.Build == nil || abs(filepath.Join(dir, s.Build.Context, s.Build.Dockerfile)) != abs(dockerfile) {
			t.Errorf("%s: %s should build from %s with the repository as context", composeFile, name, dockerfile)
		} else if abs(filepath.Join(dir, s.Build.Context)) != abs("..") {
			t.Errorf("%s: %s: the build context must be the repository root", composeFile, name)
		}
		if !slices.Equal(s.Command, want.args) {
			t.Errorf("%s: %s command %q, want %q", composeFile, name, s.Command, want.args)
		}
		for dep, cond := range want.deps {
			if got := s.DependsOn[dep].Condition; got != cond {
				t.Errorf("%s: %s depends on %s with condition %q, want %q", composeFile, name, dep, got, cond)
			}
		}
	}

	env := daemon.env(t)
	addr := env["INBOXKEEPER_METRICS_ADDR"]
	if host, _, _ := net.SplitHostPort(addr); host != "0.0.0.0" {
		t.Errorf("%s: inboxkeeper INBOXKEEPER_METRICS_ADDR=%q, want 0.0.0.0:PORT so that the published port reaches it", composeFile, addr)
	}
	port := strconv.Itoa(portOf(t, composeFile, addr))
	if !slices.ContainsFunc(daemon.Ports, func(p string) bool { return strings.HasSuffix(p, ":"+port) }) {
		t.Errorf("%s: inboxkeeper publishes %v, not the metrics port %s", composeFile, daemon.Ports, port)
	}
	policyFile := env["INBOXKEEPER_POLICY_FILE"]
	mounted := false
	for _, v := range daemon.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && parts[1] == policyFile {
			mounted = true
			if filepath.Clean(filepath.Join(dir, parts[0])) != filepath.Clean(policyExample) {
				t.Errorf("%s: the policy comes from %s, want %s", composeFile, parts[0], policyExample)
			}
		}
	}
	if !mounted {
		t.Errorf("%s: INBOXKEEPER_POLICY_FILE=%q is not mounted", composeFile, policyFile)
	}
	checkPolicy(t, policyExample, []byte(testfile.Read(t, policyExample)))
	if uid, _, _ := strings.Cut(daemon.User, ":"); uid == "0" || uid == "root" {
		t.Errorf("%s: inboxkeeper runs as root", composeFile)
	}
}

// ---------------------------------------------------------------------------
// The role script
// ---------------------------------------------------------------------------

var (
	createTable    = regexp.MustCompile(`(?i)CREATE TABLE (?:IF NOT EXISTS )?inboxkeeper\.(\w+)`)
	createFunction = regexp.MustCompile(`(?i)CREATE (?:OR REPLACE )?FUNCTION inboxkeeper\.(\w+)`)
)

// controlSchema lists the tables and functions the migrations create.
func controlSchema(t *testing.T) (tables, functions []string) {
	t.Helper()
	files, err := filepath.Glob("../migrations/sql/*.sql")
	if err != nil || len(files) == 0 {
		t.Fatalf("no migrations: %v", err)
	}
	files = append(files, "../migrations/migrations.go") // schema_version
	for _, f := range files {
		body := testfile.Read(t, f)
		for _, m := range createTable.FindAllStringSubmatch(body, -1) {
			tables = append(tables, m[1])
		}
		for _, m := range createFunction.FindAllStringSubmatch(body, -1) {
			functions = append(functions, m[1])
		}
	}
	slices.Sort(tables)
	slices.Sort(functions)
	return slices.Compact(tables), slices.Compact(functions)
}

// sqlStatements strips comments and psql meta-commands and splits on ';'
// (the script keeps semicolons out of strings).
func sqlStatements(script string) []string {
	var b strings.Builder
	for _, line := range strings.Split(script, "\n") {
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i]
		}
		if strings.HasPrefix(strings.TrimSpace(line), `\`) {
			continue
		}
		b.WriteString(line + "\n")
	}
	var out []string
	for _, s := range strings.Split(b.String(), ";") {
		if s = strings.Join(strings.Fields(s), " "); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// Every table and function of the control schema has a grant in role.sql:
// a migration that adds a table fails here until role.sql says who may use
// it.
func TestRoleScriptCoversTheControlSchema(t *testing.T) {
	t.Parallel()
	tables, functions := controlSchema(t)
	if !slices.Contains(tables, "holds") || !slices.Contains(tables, "schema_version") || !slices.Contains(functions, "claim") {
		t.Fatalf("the migrations parsed oddly: tables %v, functions %v", tables, functions)
	}
	var grants []string
	for _, s := range sqlStatements(testfile.Read(t, roleScript)) {
		up := strings.ToUpper(s)
		if strings.HasPrefix(up, "GRANT ") {
			grants = append(grants, s)
		}
		for _, bad := range []string{"GRANT ALL", "WITH GRANT OPTION", "WITH ADMIN OPTION", "TRUNCATE", "SUPERUSER",
			"BYPASSRLS", "CREATEROLE", "CREATEDB", "REPLICATION", " ON DATABASE", "GRANT CREATE", "SECURITY DEFINER"} {
			if strings.Contains(up, bad) {
				t.Errorf("%s: %q grants more than the daemon needs (%s)", roleScript, s, bad)
			}
		}
	}
	for _, tbl := range tables {
		re := regexp.MustCompile(`(?i)^GRANT .* ON TABLE .*\binboxkeeper\.` + tbl + `\b`)
		if !slices.ContainsFunc(grants, re.MatchString) {
			t.Errorf("%s: no grant on the control-schema table inboxkeeper.%s (created by a migration); say which role may use it, and how", roleScript, tbl)
		}
	}
	for _, fn := range functions {
		re := regexp.MustCompile(`(?i)^GRANT EXECUTE ON FUNCTION .*\binboxkeeper\.` + fn + `\(`)
		if !slices.ContainsFunc(grants, re.MatchString) {
			t.Errorf("%s: no GRANT EXECUTE on inboxkeeper.%s", roleScript, fn)
		}
	}
}

var psqlVariable = regexp.MustCompile(`:(['"])([A-Za-z_][A-Za-z0-9_]*)['"]`)

// psqlScript does what psql does with the script, for the few meta-commands
// it uses: \set, \if :{?name} / \else / \endif, and :'name' and :"name"
// interpolation. Anything else fails the test, so that a new meta-command
// is a conscious choice (the script is meant for psql, which the tests
// cannot count on).
func psqlScript(t *testing.T, script string, vars map[string]string) string {
	t.Helper()
	type branch struct{ on, taken bool }
	var stack []branch
	active := func() bool {
		for _, b := range stack {
			if !b.on {
				return false
			}
		}
		return true
	}
	var out strings.Builder
	for i, line := range strings.Split(script, "\n") {
		where := fmt.Sprintf("%s:%d", roleScript, i+1)
		trim := strings.TrimSpace(line)
		if strings.HasPrefix(trim, `\`) {
			f := strings.Fields(trim)
			switch f[0] {
			case `\if`:
				m := regexp.MustCompile(`^:\{\?([A-Za-z_][A-Za-z0-9_]*)\}$`).FindStringSubmatch(strings.Join(f[1:], ""))
				if m == nil {
					t.Fatalf("%s: the test's psql stand-in only knows \\if :{?name}", where)
				}
				_, defined := vars[m[1]]
				stack = append(stack, branch{on: defined, taken: defined})
			case `\else`:
				if len(stack) == 0 {
					t.Fatalf("%s: \\else without \\if", where)
				}
				b := &stack[len(stack)-1]
				b.on, b.taken = !b.taken, true
			case `\endif`:
				if len(stack) == 0 {
					t.Fatalf("%s: \\endif without \\if", where)
				}
				stack = stack[:len(stack)-1]
			case `\set`:
				if active() && len(f) >= 2 {
					vars[f[1]] = strings.Join(f[2:], "")
				}
			default:
				t.Fatalf("%s: the test's psql stand-in does not know %s", where, f[0])
			}
			out.WriteString("\n")
			continue
		}
		if !active() || strings.HasPrefix(trim, "--") {
			out.WriteString("\n")
			continue
		}
		line = psqlVariable.ReplaceAllStringFunc(line, func(s string) string {
			m := psqlVariable.FindStringSubmatch(s)
			v, ok := vars[m[2]]
			if !ok {
				t.Fatalf("%s: psql variable %s is not set", where, m[2])
			}
			if m[1] == "'" {
				return "'" + strings.ReplaceAll(v, "'", "''") + "'"
			}
			return `"` + strings.ReplaceAll(v, `"`, `""`) + `"`
		})
		out.WriteString(line + "\n")
	}
	if len(stack) != 0 {
		t.Fatalf("%s: \\if without \\endif", roleScript)
	}
	return out.String()
}

func goTool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to build inboxkeeper: %v", err)
	}
	return p
}

const testVersion = "deploy-test"

// inboxkeeperBinary builds cmd/inboxkeeper into the test's temporary
// directory, with the version flag the Dockerfile uses.
func inboxkeeperBinary(t *testing.T) string {
	t.Helper()
	binary := filepath.Join(t.TempDir(), "inboxkeeper")
	// Not the Dockerfile's -trimpath and CGO_ENABLED=0: either would rebuild
	// the standard library instead of reusing the build cache.
	cmd := exec.Command(goTool(t), "build", "-ldflags", "-X main.version="+testVersion, "-o", binary, "./cmd/inboxkeeper")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./cmd/inboxkeeper: %v\n%s", err, out)
	}
	return binary
}

// asUser returns dsn with the user and password replaced.
func asUser(t *testing.T, dsn, user, password string) string {
	t.Helper()
	if strings.Contains(dsn, "://") {
		u, err := url.Parse(dsn)
		if err != nil {
			t.Fatal(err)
		}
		u.User = url.UserPassword(user, password)
		return u.String()
	}
	return fmt.Sprintf("%s user='%s' password='%s'", dsn, user, password) // later keywords win
}

// cli runs the inboxkeeper binary with exactly the given INBOXKEEPER_*
// variables, as a deployment would.
type cli struct {
	t   *testing.T
	bin string
	env []string
}

func (c cli) with(vars ...string) cli {
	return cli{t: c.t, bin: c.bin, env: slices.Concat(c.env, vars)}
}

func (c cli) command(args ...string) *exec.Cmd {
	cmd := exec.Command(c.bin, args...)
	for _, kv := range os.Environ() {
		name, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(name, "INBOXKEEPER_") || slices.Contains([]string{"PGUSER", "PGPASSWORD", "PGPASSFILE",
			"PGSERVICE", "PGSERVICEFILE", "PGDATABASE", "PGOPTIONS"}, name) {
			continue
		}
		cmd.Env = append(cmd.Env, kv)
	}
	cmd.Env = append(cmd.Env, c.env...)
	return cmd
}

// run runs a command and returns its exit status and output.
func (c cli) run(args ...string) (int, string) {
	c.t.Helper()
	var out bytes.Buffer
	cmd := c.command(args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0, out.String()
	case errors.As(err, &ee):
		return ee.ExitCode(), out.String()
	}
	c.t.Fatalf("inboxkeeper %s: %v", strings.Join(args, " "), err)
	return -1, ""
}

// ok runs a command that must succeed and returns its output.
func (c cli) ok(args ...string) string {
	c.t.Helper()
	code, out := c.run(args...)
	if code != 0 {
		c.t.Fatalf("inboxkeeper %s: exit status %d\n%s", strings.Join(args, " "), code, out)
	}
	return out
}

// refusedWithin runs a command that the role's grants must refuse, and
// that must end within d: one still running then is killed, and fails
// the test.
func (c cli) refusedWithin(d time.Duration, args ...string) {
	t := c.t
	t.Helper()
	var out syncbuf.Buffer
	cmd := c.command(args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(d):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("inboxkeeper %s was refused but had not ended after %s (killed)\n%s", strings.Join(args, " "), d, out.String())
	}
	if code := cmd.ProcessState.ExitCode(); code == 0 || !strings.Contains(out.String(), "permission denied") {
		t.Errorf("inboxkeeper %s: want permission denied, got exit status %d\n%s", strings.Join(args, " "), code, out.String())
	}
}

// refused runs a command that the role's grants must refuse; it must end
// within two minutes.
func (c cli) refused(args ...string) {
	c.t.Helper()
	c.refusedWithin(2*time.Minute, args...)
}

// applyRoleScript runs role.sql as the owner, with unique role names (roles
// are cluster-wide, and other tests share the server), and removes the roles
// at the end.
func applyRoleScript(t *testing.T, owner *pgx.Conn, vars map[string]string) {
	t.Helper()
	ctx := context.Background()
	sql := psqlScript(t, testfile.Read(t, roleScript), vars)
	if _, err := owner.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", roleScript, err)
	}
	// Idempotent: a second run changes nothing and fails nothing.
	if _, err := owner.Exec(ctx, psqlScript(t, testfile.Read(t, roleScript), vars)); err != nil {
		t.Fatalf("%s, run a second time: %v", roleScript, err)
	}
}

func dropRoles(t *testing.T, ownerURL string, roles ...string) {
	t.Helper()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, ownerURL)
		if err != nil {
			t.Errorf("drop roles: %v", err)
			return
		}
		defer conn.Close(ctx)
		for _, r := range roles {
			var exists bool
			if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = $1)", r).Scan(&exists); err != nil || !exists {
				continue
			}
			id := pgx.Identifier{r}.Sanitize()
			if _, err := conn.Exec(ctx, "DROP OWNED BY "+id+"; DROP ROLE "+id); err != nil {
				t.Errorf("drop role %s: %v", r, err)
			}
		}
	})
}

func expectSQLState(t *testing.T, conn *pgx.Conn, code, sql string) {
	t.Helper()
	_, err := conn.Exec(context.Background(), sql)
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != code {
		t.Errorf("%s: want SQLSTATE %s, got %v", sql, code, err)
	}
}

func count(t *testing.T, conn *pgx.Conn, where string) int {
	t.Helper()
	var n int
	if err := conn.QueryRow(context.Background(), "SELECT count(*) FROM public.consumer_inbox WHERE "+where).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// inboxRows fill the recommended inbox table (inbox/schema/plain.sql,
// the layout the README shows).
const inboxRows = `
-- expired, deletable
INSERT INTO public.consumer_inbox (consumer, message_id, payload_hash, event_time, first_seen_at, remember_until)
SELECT 'payments', 'old-' || i, '\x00', now() - interval '60 days', now() - interval '60 days', now() - interval '10 days' + i * interval '1 second'
FROM generate_series(1, 50) i;
-- expired, but the operator will hold the scope
INSERT INTO public.consumer_inbox (consumer, message_id, payload_hash, event_time, first_seen_at, remember_until)
SELECT 'held', 'old-' || i, '\x00', now() - interval '60 days', now() - interval '60 days', now() - interval '10 days'
FROM generate_series(1, 20) i;
-- still promised
INSERT INTO public.consumer_inbox (consumer, message_id, payload_hash, event_time, first_seen_at, remember_until)
SELECT 'payments', 'new-' || i, '\x00', now() - interval '1 day', now() - interval '1 day', now() + interval '49 days'
FROM generate_series(1, 30) i;
`

// The compose example's inbox is the recommended layout, to the letter: the
// example is where a newcomer copies it from, so it must not drift from the
// layout the library is tested with. Its postgres runs inbox/schema/plain.sql
// itself, mounted, as the first of its initdb scripts.
func TestComposeInboxIsTheRecommendedLayout(t *testing.T) {
	t.Parallel()
	var scripts []string // "NAME SOURCE", in the order the entrypoint runs them
	for _, v := range readCompose(t)["postgres"].Volumes {
		src, dst, _ := strings.Cut(v, ":")
		dst, _, _ = strings.Cut(dst, ":")
		if path.Dir(dst) == "/docker-entrypoint-initdb.d" {
			scripts = append(scripts, path.Base(dst)+" "+filepath.Join(filepath.Dir(composeFile), src))
		}
	}
	slices.Sort(scripts)
	if want := "10-consumer-inbox.sql " + filepath.Clean(recommendedInbox); len(scripts) == 0 || scripts[0] != want {
		t.Errorf("%s: the postgres service's first initdb script is not the recommended inbox\nwant: %s\n got: %q", composeFile, want, scripts)
	}
}

// The example policy's table is the recommended one as inbox.PlainPolicy
// gives it (the example adds comments and a retention section): the same
// entry, field for field.
func TestPolicyExampleIsTheRecommendedPolicy(t *testing.T) {
	t.Parallel()
	checkRecommendedTables(t, policyExample, checkPolicy(t, policyExample, []byte(testfile.Read(t, policyExample))))
}

// checkRecommendedTables: a policy's tables are inbox.PlainPolicy's, field
// for field.
func checkRecommendedTables(t *testing.T, where string, got *policy.Policy) {
	t.Helper()
	want, err := policy.Parse([]byte(inbox.PlainPolicy), "inbox.PlainPolicy")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Tables) != len(want.Tables) {
		t.Fatalf("%s has %d tables, inbox.PlainPolicy %d", where, len(got.Tables), len(want.Tables))
	}
	for i := range want.Tables {
		g, w := got.Tables[i], want.Tables[i]
		g.Line, w.Line = 0, 0
		if !reflect.DeepEqual(g, w) {
			t.Errorf("%s: table %d is\n%+v\nwant inbox.PlainPolicy's\n%+v", where, i, g, w)
		}
	}
}

// The README's quick start shows the recommended inbox table and its policy
// as inbox/schema has them (comments and white space aside), so that a new
// user starts from the layout the library is tested with.
func TestReadmeQuickStart(t *testing.T) {
	t.Parallel()
	const readme = "../README.md"
	text := testfile.Read(t, readme)
	i := strings.Index(text, "\n## Quick start")
	if i < 0 {
		t.Fatalf("%s has no Quick start section", readme)
	}
	section := text[i+1:]
	if j := strings.Index(section, "\n## "); j >= 0 {
		section = section[:j]
	}
	block := func(lang string) string {
		m := regexp.MustCompile("(?s)```" + lang + "\n(.*?)```").FindStringSubmatch(section)
		if m == nil {
			t.Fatalf("%s's quick start has no %s block", readme, lang)
		}
		return m[1]
	}
	if got, want := normaliseSQL(block("sql")), normaliseSQL(testfile.Read(t, recommendedInbox)); got != want {
		t.Errorf("%s's quick start table is not %s:\n got: %s\nwant: %s", readme, recommendedInbox, got, want)
	}
	p, err := policy.Parse([]byte(block("yaml")), readme)
	if err != nil {
		t.Fatalf("%s's quick start policy does not parse: %v", readme, err)
	}
	checkRecommendedTables(t, readme+"'s quick start policy", p)
}

// normaliseSQL drops -- comments and folds white space, which change no
// statement.
func normaliseSQL(script string) string {
	var lines []string
	for _, line := range strings.Split(script, "\n") {
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i]
		}
		lines = append(lines, line)
	}
	return strings.Join(strings.Fields(strings.Join(lines, " ")), " ")
}

// ownerDatabase is a new database and a connection to it as its owner, the
// user that creates the application's tables and runs migrate.
func ownerDatabase(t *testing.T) (*pgx.Conn, string) {
	t.Helper()
	url := pgtest.NewDatabase(t)
	return connect(t, url), url
}

// connect is a connection to url, closed when the test ends.
func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// The role script on a real server: as the roles it creates, every command
// of the deployed binary works, and what a role should not do is refused.
func TestRoleScriptOnPostgreSQL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := inboxkeeperBinary(t)
	owner, ownerURL := ownerDatabase(t)
	pgtest.Exec(t, owner, testfile.Read(t, recommendedInbox)+inboxRows)
	if _, err := migrations.Migrate(ctx, owner); err != nil {
		t.Fatal(err)
	}

	// The roles, with names unique on the server.
	suffix := fmt.Sprintf("%d_%d", os.Getpid(), time.Now().UnixNano()%1e6)
	role, operatorRole, consumerRole := "ik_daemon_"+suffix, "ik_operator_"+suffix, "ik_consumer_"+suffix
	daemonUser, operatorUser, consumerUser := "ik_app_"+suffix, "ik_ops_"+suffix, "ik_svc_"+suffix
	dropRoles(t, ownerURL, daemonUser, operatorUser, consumerUser, operatorRole, consumerRole, role)
	// SELECT by column: outcome stands for a payload, which no command
	// reads.
	applyRoleScript(t, owner, map[string]string{
		"role": role, "operator_role": operatorRole, "consumer_role": consumerRole,
		"table_schema": "public", "table_name": "consumer_inbox", "expiry_column": "remember_until",
		"private_columns": "outcome",
	})
	const password = "deploy-test-password"
	for user, member := range map[string]string{daemonUser: role, operatorUser: operatorRole, consumerUser: consumerRole} {
		pgtest.Exec(t, owner, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s' IN ROLE %s",
			pgx.Identifier{user}.Sanitize(), password, pgx.Identifier{member}.Sanitize()))
	}
	// The application's own privileges on its inbox, which the claim uses.
	pgtest.Exec(t, owner, "GRANT SELECT, INSERT, UPDATE ON public.consumer_inbox TO "+pgx.Identifier{consumerUser}.Sanitize())

	daemonURL := asUser(t, ownerURL, daemonUser, password)
	policyFile, err := filepath.Abs(policyExample)
	if err != nil {
		t.Fatal(err)
	}
	base := cli{t: t, bin: bin}.with("INBOXKEEPER_POLICY_FILE="+policyFile, "INBOXKEEPER_LOG_FORMAT=json")
	daemon := base.with("INBOXKEEPER_DATABASE_URL=" + daemonURL)
	operator := base.with("INBOXKEEPER_DATABASE_URL=" + asUser(t, ownerURL, operatorUser, password))

	if out := daemon.ok("version"); !strings.Contains(out, testVersion) {
		t.Errorf("inboxkeeper version = %q: -X main.version (as in the Dockerfile) did not take", out)
	}

	// The operator: install the retention rules, hold a scope, mark a
	// replay, pause and resume.
	operator.ok("plan", "--apply")
	holdID := strings.TrimSpace(operator.ok("hold", "add", "--table", "public.consumer_inbox", "--scope", "held",
		"--reason", "legal hold", "--owner", "deploy-test"))
	if _, err := strconv.Atoi(holdID); err != nil {
		t.Fatalf("hold add printed %q, want an id", holdID)
	}
	now := time.Now().UTC()
	replayID := strings.TrimSpace(operator.ok("replay", "start", "--table", "public.consumer_inbox", "--scope", "payments",
		"--from", now.Add(-2*time.Hour).Format(time.RFC3339), "--to", now.Add(-time.Hour).Format(time.RFC3339), "--owner", "deploy-test"))
	operator.ok("pause", "--reason", "deploy test")
	if out := daemon.ok("status"); !strings.Contains(out, "PAUSED") {
		t.Errorf("status as the daemon does not show the operator's pause:\n%s", out)
	}
	operator.ok("resume")
	// Runtime settings: the operator changes them, the daemon reads them.
	operator.ok("set", "batch_size=1000", "--reason", "deploy test")
	if out := daemon.ok("settings"); !strings.Contains(out, "(global setting)") {
		t.Errorf("settings as the daemon does not show the operator's setting:\n%s", out)
	}
	daemon.ok("settings", "--history")
	operator.ok("set", "--unset", "batch_size", "--reason", "deploy test")

	// The daemon: a pass deletes the expired rows, and leaves the held ones.
	daemon.ok("once", "--dry-run")
	daemon.ok("once")
	if n := count(t, owner, "consumer = 'payments' AND remember_until <= now()"); n != 0 {
		t.Errorf("after once as the daemon role, %d expired rows are left", n)
	}
	if n := count(t, owner, "consumer = 'held'"); n != 20 {
		t.Errorf("after once, %d of the 20 held rows are left", n)
	}
	if n := count(t, owner, "remember_until > now()"); n != 30 {
		t.Errorf("after once, %d of the 30 promised rows are left", n)
	}
	// What a leaked secret of each could do, as status says it.
	if out := daemon.ok("status", "--json"); !strings.Contains(out, `"role_powers": []`) {
		t.Errorf("status --json as the daemon's login lists powers it must not have:\n%s", out)
	}
	if out := operator.ok("status"); !strings.Contains(out, "this role may also: release holds") || !strings.Contains(out, "add holds") {
		t.Errorf("status as the operator does not say it may write holds:\n%s", out)
	}
	daemon.ok("hold", "list")
	daemon.ok("replay", "list")
	daemon.ok("plan", "--check")
	daemon.ok("partitions", "ensure", "--dry-run")
	// Compaction's VACUUM needs the table's owner (or MAINTAIN, from
	// PostgreSQL 17), which role.sql does not give: the compaction, and
	// its dry run, are refused, saying so, with nothing moved.
	for _, args := range [][]string{{"compact", "--table", "public.consumer_inbox", "--dry-run"}, {"compact", "--table", "public.consumer_inbox"}} {
		if code, out := daemon.run(args...); code != 2 || !strings.Contains(out, "this role may not VACUUM it") {
			t.Errorf("%s as the daemon role, without the table's ownership: exit %d, want 2 saying it may not VACUUM:\n%s", strings.Join(args, " "), code, out)
		}
	}

	// What the daemon must not do: change what it may delete, or anything
	// else.
	daemon.refused("hold", "release", holdID)
	daemon.refused("hold", "add", "--table", "public.consumer_inbox", "--reason", "x", "--owner", "x")
	daemon.refused("replay", "finish", replayID)
	daemon.refused("pause", "--reason", "x")
	daemon.refused("set", "batch_size=10", "--reason", "x")
	daemon.refused("plan", "--apply")
	operator.ok("replay", "finish", replayID)

	// The operator reads everything a person needs, and may not delete:
	// it is not a member of the daemon's role (before, it was, and could
	// delete any inbox row by hand).
	for _, args := range [][]string{{"status"}, {"settings"}, {"hold", "list", "--all"}, {"replay", "list", "--all"}, {"plan", "--check"}} {
		operator.ok(args...)
	}
	operator.refused("once")
	operator.refused("compact", "--table", "public.consumer_inbox")
	oconn := connect(t, asUser(t, ownerURL, operatorUser, password))
	for _, sql := range []string{
		"SELECT outcome FROM public.consumer_inbox", // a private column
		"SELECT * FROM public.consumer_inbox",
		"DELETE FROM public.consumer_inbox WHERE remember_until <= now()",
		"UPDATE public.consumer_inbox SET remember_until = now() WHERE false",
		"TRUNCATE public.consumer_inbox",
		"DELETE FROM inboxkeeper.holds",
		"DELETE FROM inboxkeeper.replays",
		"UPDATE inboxkeeper.partitions SET dropped_at = now()",
		"DELETE FROM inboxkeeper.lease",
	} {
		expectSQLState(t, oconn, "42501", sql)
	}
	// An operator an earlier version of the script made a member of the
	// daemon's role is no longer one once the script runs again.
	member := func() bool {
		var m bool
		if err := owner.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_auth_members a JOIN pg_roles g ON g.oid = a.roleid
JOIN pg_roles m ON m.oid = a.member WHERE g.rolname = $1 AND m.rolname = $2)`, role, operatorRole).Scan(&m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	if _, err := owner.Exec(ctx, "GRANT "+pgx.Identifier{role}.Sanitize()+" TO "+pgx.Identifier{operatorRole}.Sanitize()); err != nil || !member() {
		t.Fatalf("make the operator a member as the old script did: %v", err)
	}
	// SELECT by column: outcome stands for a payload, which no command
	// reads.
	applyRoleScript(t, owner, map[string]string{
		"role": role, "operator_role": operatorRole, "consumer_role": consumerRole,
		"table_schema": "public", "table_name": "consumer_inbox", "expiry_column": "remember_until",
		"private_columns": "outcome",
	})
	if member() {
		t.Error("role.sql left the operator a member of the daemon's role")
	}

	// The consumer claims, and may run no command of the daemon's or the
	// operator's.
	consumer := base.with("INBOXKEEPER_DATABASE_URL=" + asUser(t, ownerURL, consumerUser, password))
	for _, args := range [][]string{{"once"}, {"status"}, {"hold", "add", "--table", "public.consumer_inbox", "--reason", "x", "--owner", "x"},
		{"hold", "release", holdID}, {"pause", "--reason", "x"}, {"plan", "--apply"}, {"set", "batch_size=10", "--reason", "x"}} {
		consumer.refused(args...)
	}

	dconn := connect(t, daemonURL)
	for _, sql := range []string{
		"SELECT outcome FROM public.consumer_inbox", // a private column
		"SELECT * FROM public.consumer_inbox",
		"TRUNCATE public.consumer_inbox",
		"INSERT INTO public.consumer_inbox (consumer, message_id, payload_hash, event_time, first_seen_at, remember_until) VALUES ('x', 'x', '\\x00', now(), now(), now())",
		"UPDATE public.consumer_inbox SET outcome = 'x'",
		"UPDATE public.consumer_inbox SET consumer = 'x'",
		"DELETE FROM inboxkeeper.holds",
		"UPDATE inboxkeeper.holds SET released_at = now()",
		"DELETE FROM inboxkeeper.retention_rules",
		"DELETE FROM inboxkeeper.schema_version",
		"UPDATE inboxkeeper.fence SET id = true",
		"CREATE TABLE inboxkeeper.x (i int)",
		"CREATE FUNCTION inboxkeeper.x() RETURNS int LANGUAGE sql AS 'SELECT 1'",
	} {
		expectSQLState(t, dconn, "42501", sql) // insufficient_privilege
	}
	for _, sql := range []string{
		"DROP TABLE public.consumer_inbox",
		"ALTER TABLE public.consumer_inbox ADD COLUMN x int",
		"DROP TABLE inboxkeeper.holds",
		"CREATE INDEX ON public.consumer_inbox (outcome)",
	} {
		expectSQLState(t, dconn, "42501", sql) // must be owner
	}
	// The hold writers' mode of the fence, which would stall a hold add.
	if err := pgx.BeginFunc(ctx, dconn, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "LOCK TABLE inboxkeeper.fence IN SHARE MODE")
		return err
	}); retry.Code(err) != "42501" {
		t.Errorf("LOCK TABLE inboxkeeper.fence IN SHARE MODE as the daemon: %v, want SQLSTATE 42501", err)
	}
	// The throttle's statistics of other roles' sessions.
	var stats bool
	if err := dconn.QueryRow(ctx, "SELECT pg_has_role('pg_read_all_stats', 'USAGE')").Scan(&stats); err != nil || !stats {
		t.Errorf("the daemon role does not have pg_read_all_stats' privileges (%v, %v)", stats, err)
	}

	// FOR UPDATE SKIP LOCKED needs UPDATE on a column: without the grant
	// on the expiry column, the pass fails, deletes nothing, and ends. With
	// more than two batches due, the look it begins with stops at two and
	// leaves an exact count waiting beside it, which the failed pass drops:
	// before 3ff3c29 that drop waited for ever when the count already had
	// its snapshot: a race, which ten passes lost in each of two runs of
	// this test against the old code (and TestHeldCountDroppedWithoutCancel
	// pins down without one).
	pgtest.Exec(t, owner, `INSERT INTO public.consumer_inbox (consumer, message_id, payload_hash, event_time, first_seen_at, remember_until)
SELECT 'payments', 'late' || CASE WHEN i > 1 THEN '-' || i ELSE '' END, '\x00', now() - interval '60 days', now() - interval '60 days', now() - interval '1 day'
FROM generate_series(1, 3000) i`)
	pgtest.Exec(t, owner, "REVOKE UPDATE (remember_until) ON public.consumer_inbox FROM "+pgx.Identifier{role}.Sanitize())
	for range 10 {
		daemon.with("INBOXKEEPER_BATCH_SIZE=1000").refusedWithin(20*time.Second, "once")
	}
	if n := count(t, owner, "message_id LIKE 'late%'"); n != 3000 {
		t.Errorf("once without UPDATE (remember_until) deleted %d of the 3,000 due rows", 3000-n)
	}
	pgtest.Exec(t, owner, "GRANT UPDATE (remember_until) ON public.consumer_inbox TO "+pgx.Identifier{role}.Sanitize())

	// A column the policy names (event_time) withheld as private: the pass
	// fails before any batch, naming it, and deletes nothing. Without the
	// check each batch failed with "permission denied for table
	// consumer_inbox", which names no column.
	vars := map[string]string{
		"role": role, "operator_role": operatorRole, "consumer_role": consumerRole,
		"table_schema": "public", "table_name": "consumer_inbox", "expiry_column": "remember_until",
		"private_columns": "outcome, event_time",
	}
	applyRoleScript(t, owner, vars)
	if code, out := daemon.run("once"); code == 0 || !strings.Contains(out, "may not read event_time of public.consumer_inbox") {
		t.Errorf("once without SELECT (event_time): exit %d, want a failure naming the column:\n%s", code, out)
	}
	if n := count(t, owner, "message_id LIKE 'late%'"); n != 3000 {
		t.Errorf("once without SELECT (event_time) deleted %d of the 3,000 due rows", 3000-n)
	}
	vars["private_columns"] = "outcome"
	applyRoleScript(t, owner, vars)

	// The daemon as the sidecar runs it, with a heartbeat (the primary
	// doubles as the standby it reads), until SIGTERM; nothing it does may
	// log a warning. The lag threshold is high so that a loaded machine does
	// not pause it (pausing is a warning too).
	// Debug: a pass that goes as planned says "pass done" only there.
	runDaemon(t, daemon.with("INBOXKEEPER_METRICS_ADDR=127.0.0.1:0", "INBOXKEEPER_REPLICA_URLS="+daemonURL,
		"INBOXKEEPER_MAX_REPLICA_LAG=1m", "INBOXKEEPER_INTERVAL=1h", "INBOXKEEPER_LOG_LEVEL=debug"), func() time.Time {
		var at time.Time
		_ = owner.QueryRow(context.Background(), "SELECT beat FROM inboxkeeper.heartbeat").Scan(&at)
		return at
	})
	if n := count(t, owner, "message_id = 'late'"); n != 0 {
		t.Errorf("run did not delete the expired row")
	}

	// A consumer claims through inboxkeeper.claim with its role, and may not
	// touch the control schema otherwise.
	cconn, err := pgx.Connect(ctx, asUser(t, ownerURL, consumerUser, password))
	if err != nil {
		t.Fatal(err)
	}
	defer cconn.Close(ctx)
	err = pgx.BeginFunc(ctx, cconn, func(tx pgx.Tx) error {
		r, err := inbox.Claim(ctx, tx, inbox.Message{Table: "public.consumer_inbox", Consumer: "payments",
			MessageID: "claimed", Payload: []byte("{}"), EventTime: now})
		if err == nil && r.Kind != inbox.Fresh {
			err = fmt.Errorf("claim: %s, want fresh", r.Kind)
		}
		return err
	})
	if err != nil {
		t.Errorf("claim as the consumer role: %v", err)
	}
	expectSQLState(t, cconn, "42501", "UPDATE inboxkeeper.retention_rules SET margin = '0'")
	expectSQLState(t, cconn, "42501", "SELECT * FROM inboxkeeper.holds")
}

// runDaemon runs `inboxkeeper run` until its first pass is done, checks its
// probes, lets its heartbeat (read with beat) advance twice, stops it with
// SIGTERM and fails on any warning it logged.
func runDaemon(t *testing.T, c cli, beat func() time.Time) {
	t.Helper()
	cmd := c.command("run")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	lines := make(chan map[string]any, 1000)
	var mu sync.Mutex
	var logged []string
	log := func() string {
		mu.Lock()
		defer mu.Unlock()
		return strings.Join(logged, "\n")
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			mu.Lock()
			logged = append(logged, sc.Text())
			mu.Unlock()
			var rec map[string]any
			if json.Unmarshal(sc.Bytes(), &rec) == nil {
				lines <- rec
			}
		}
		close(lines)
		exited <- cmd.Wait()
	}()
	stopped := false
	defer func() {
		if !stopped {
			_ = cmd.Process.Kill()
		}
	}()

	addr := ""
	timeout := time.After(60 * time.Second)
	var warnings []string
wait:
	for {
		select {
		case rec, ok := <-lines:
			if !ok {
				stopped = true
				t.Fatalf("inboxkeeper run exited before its first pass: %v\n%s", <-exited, log())
			}
			if lvl := rec["level"]; lvl == "WARN" || lvl == "ERROR" {
				warnings = append(warnings, fmt.Sprint(rec))
			}
			switch rec["msg"] {
			case "inboxkeeper: metrics listening":
				addr, _ = rec["addr"].(string)
			case "inboxkeeper: pass done":
				break wait
			}
		case <-timeout:
			t.Fatalf("inboxkeeper run: no pass done within 60s:\n%s", log())
		}
	}
	for _, p := range []string{"/livez", "/readyz", "/metrics"} {
		resp, err := http.Get("http://" + addr + p)
		if err != nil {
			t.Errorf("GET %s: %v", p, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("GET %s: %s", p, resp.Status)
		}
	}
	// The heartbeat and the collectors run on tickers of their own (between
	// passes the listed standby is read, after a fresh heartbeat, every ten
	// seconds): wait until the heartbeat was written twice after the first
	// pass, so that each has run (and could have logged a warning) more than
	// once.
	first := beat()
	pgtest.WaitFor(t, 30*time.Second, "the daemon's heartbeat to advance", func() bool { return beat().After(first) })
	second := beat()
	pgtest.WaitFor(t, 30*time.Second, "the daemon's heartbeat to advance again", func() bool { return beat().After(second) })
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// It stops within a few seconds; a hang is a failure, not a stuck test.
	killer := time.AfterFunc(30*time.Second, func() { _ = cmd.Process.Kill() })
	defer killer.Stop()
	for rec := range lines {
		if lvl := rec["level"]; lvl == "WARN" || lvl == "ERROR" {
			warnings = append(warnings, fmt.Sprint(rec))
		}
	}
	err = <-exited
	stopped = true
	if err != nil {
		t.Errorf("inboxkeeper run after SIGTERM: %v\n%s", err, log())
	}
	if len(warnings) > 0 {
		t.Errorf("inboxkeeper run as the daemon role logged:\n%s", strings.Join(warnings, "\n"))
	}
}

// ---------------------------------------------------------------------------
// The document
// ---------------------------------------------------------------------------

// docs/operations/deploying.md mentions every file here, so that none is left unexplained.
func TestDeployDocumentMentionsEveryFile(t *testing.T) {
	t.Parallel()
	doc := testfile.Read(t, deployDocument)
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		top := strings.Split(filepath.ToSlash(p), "/")[0]
		if !slices.Contains([]string{"kubernetes", "systemd", "docker", "sql", "helm", "release", "kubecheck"}, top) {
			return nil // doc.go, this file, and directories owned elsewhere
		}
		switch {
		case top == "docker" && strings.HasPrefix(filepath.ToSlash(p), "docker/initdb/"):
			p = "docker/initdb"
		case top == "helm": // the chart, as a whole
			p = "helm/inboxkeeper"
		case top == "kubecheck":
			p = "kubecheck"
		}
		if !strings.Contains(doc, "deploy/"+filepath.ToSlash(p)) {
			t.Errorf("%s does not mention deploy/%s", deployDocument, filepath.ToSlash(p))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// Tiering with the least-privilege roles: the owner's migrate creates the
// permanent key tables, and the daemon role demotes (in place and from a
// side table) and deletes with keys, with only the grants role.sql gives.
func TestRoleScriptTiering(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := inboxkeeperBinary(t)
	owner, ownerURL := ownerDatabase(t)
	pgtest.Exec(t, owner, `
CREATE TABLE public.inplace (consumer text NOT NULL, message_id text NOT NULL, payload_hash bytea NOT NULL, outcome text,
  first_seen_at timestamptz, remember_until timestamptz, business_key text, payload text, PRIMARY KEY (consumer, message_id));
CREATE INDEX ON public.inplace (remember_until);
CREATE INDEX ON public.inplace (first_seen_at) WHERE payload IS NOT NULL;
CREATE TABLE public.side (consumer text NOT NULL, message_id text NOT NULL, payload_hash bytea NOT NULL, outcome text,
  first_seen_at timestamptz, remember_until timestamptz, PRIMARY KEY (consumer, message_id));
CREATE INDEX ON public.side (remember_until);
CREATE SCHEMA payloads;
CREATE TABLE payloads.side_payload (consumer text NOT NULL, message_id text NOT NULL, first_seen_at timestamptz NOT NULL, payload text,
  PRIMARY KEY (consumer, message_id));
CREATE INDEX ON payloads.side_payload (first_seen_at);
INSERT INTO public.inplace SELECT 'c', 'old-' || i, '\x01', 'applied', now() - interval '40 days', now() - interval '1 day', 'bk' || i, 'p' FROM generate_series(1, 10) i;
INSERT INTO public.inplace SELECT 'c', 'warm-' || i, '\x01', 'applied', now() - interval '5 days', now() + interval '1 day', 'bk' || i, 'p' FROM generate_series(11, 20) i;
INSERT INTO public.side SELECT consumer, message_id, payload_hash, outcome, first_seen_at, remember_until FROM public.inplace;
INSERT INTO payloads.side_payload SELECT consumer, message_id, first_seen_at, payload FROM public.inplace;`)
	policyFile := filepath.Join(t.TempDir(), "inboxkeeper.yaml")
	if err := os.WriteFile(policyFile, []byte(`tables:
  - table: public.inplace
    key: [consumer, message_id]
    scope: consumer
    expires_at: remember_until
    tiers:
      hot_for: 3d
      anchor: first_seen_at
      payload_columns: [payload]
      permanent_key: {columns: [consumer, business_key], hash: payload_hash}
  - table: public.side
    key: [consumer, message_id]
    expires_at: remember_until
    tiers:
      hot_for: 3d
      anchor: first_seen_at
      payload_table: payloads.side_payload
      permanent_key: {columns: [consumer, message_id], table: payloads.side_keys}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	base := cli{t: t, bin: bin}.with("INBOXKEEPER_POLICY_FILE="+policyFile, "INBOXKEEPER_LOG_FORMAT=json")
	if out := base.with("INBOXKEEPER_DATABASE_URL=" + ownerURL).ok("migrate"); !strings.Contains(out, "permanent key table payloads.side_keys created for public.side") {
		t.Errorf("migrate as the owner did not create the key tables:\n%s", out)
	}

	suffix := fmt.Sprintf("%d_%d", os.Getpid(), time.Now().UnixNano()%1e6)
	role, operatorRole, consumerRole := "ik_tdaemon_"+suffix, "ik_toperator_"+suffix, "ik_tconsumer_"+suffix
	daemonUser := "ik_tapp_" + suffix
	dropRoles(t, ownerURL, daemonUser, operatorRole, consumerRole, role)
	roles := map[string]string{"role": role, "operator_role": operatorRole, "consumer_role": consumerRole}
	with := func(vars map[string]string) map[string]string {
		out := maps.Clone(roles)
		maps.Copy(out, vars)
		return out
	}
	applyRoleScript(t, owner, with(map[string]string{"table_schema": "public", "table_name": "inplace", "expiry_column": "remember_until",
		"payload_column": "payload", "keys_schema": "inboxkeeper", "keys_table": "keys_public_inplace", "private_columns": "payload"}))
	applyRoleScript(t, owner, with(map[string]string{"table_schema": "public", "table_name": "side", "expiry_column": "remember_until",
		"payload_schema": "payloads", "payload_table": "side_payload", "anchor_column": "first_seen_at", "keys_schema": "payloads", "keys_table": "side_keys",
		"private_columns": "payload"}))
	const password = "deploy-test-password"
	operatorUser := "ik_tops_" + suffix
	dropRoles(t, ownerURL, operatorUser)
	pgtest.Exec(t, owner, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s' IN ROLE %s", daemonUser, password, role))
	pgtest.Exec(t, owner, fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s' IN ROLE %s", operatorUser, password, operatorRole))
	daemonURL := asUser(t, ownerURL, daemonUser, password)
	daemon := base.with("INBOXKEEPER_DATABASE_URL=" + daemonURL)
	operatorURL := asUser(t, ownerURL, operatorUser, password)
	operator := base.with("INBOXKEEPER_DATABASE_URL=" + operatorURL)

	// The payload: in place the daemon reads it (it empties only what is
	// not empty yet) and the operator may not; in the side table neither.
	oconn := connect(t, operatorURL)
	for _, sql := range []string{"SELECT payload FROM public.inplace", "SELECT payload FROM payloads.side_payload"} {
		expectSQLState(t, oconn, "42501", sql)
	}
	if out := operator.ok("status"); !strings.Contains(out, "due for demotion:       unknown (this role may not read payload)") {
		t.Errorf("status as the operator does not say what it may not count:\n%s", out)
	}
	// Nor can it say what a pass would demote in place; it says why.
	if code, out := operator.run("once", "--dry-run"); code == 0 || !strings.Contains(out, "may not read payload of public.inplace") {
		t.Errorf("once --dry-run as the operator: exit %d, want a failure naming the payload column:\n%s", code, out)
	}
	daemon.ok("once", "--dry-run")

	out := daemon.ok("once")
	// In place, the 10 expired rows are left to the deleter, which takes
	// them (and writes their keys) right after; a side table demotes all 20.
	for _, want := range []string{"public.inplace: demoted 10 to warm", "public.side: demoted 20 to warm",
		"public.inplace: deleted 10,", "public.side: deleted 10,"} {
		if !strings.Contains(out, want) {
			t.Errorf("once as the daemon role: no %q in\n%s", want, out)
		}
	}
	for sql, want := range map[string]int{
		"SELECT count(*) FROM public.inplace WHERE payload IS NULL AND outcome = 'applied'": 10,
		"SELECT count(*) FROM payloads.side_payload":                                        0,
		"SELECT count(*) FROM inboxkeeper.keys_public_inplace":                              10,
		"SELECT count(*) FROM payloads.side_keys":                                           10,
	} {
		var n int
		if err := owner.QueryRow(ctx, sql).Scan(&n); err != nil || n != want {
			t.Errorf("%s: %d (%v), want %d", sql, n, err, want)
		}
	}
	dconn := connect(t, daemonURL)
	for _, sql := range []string{
		"UPDATE public.inplace SET outcome = 'x'",          // only the payload column
		"UPDATE public.inplace SET payload_hash = '\\x00'", // never the hash
		"UPDATE payloads.side_payload SET payload = 'x'",   // deletes, does not rewrite
		"DELETE FROM inboxkeeper.keys_public_inplace",      // keys are kept
		"UPDATE payloads.side_keys SET first_seen = now()", // and not changed
		"CREATE TABLE inboxkeeper.keys_x (i int)",          // creates no table
		"INSERT INTO payloads.side_payload VALUES ('c', 'x', now(), 'p')",
		"SELECT payload FROM payloads.side_payload", // it deletes side rows without reading them
	} {
		expectSQLState(t, dconn, "42501", sql)
	}
}
