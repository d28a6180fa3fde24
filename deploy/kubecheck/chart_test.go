package kubecheck

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/release"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"
)

const (
	chartDir  = "../helm/inboxkeeper"
	rulesFile = "../prometheus/inboxkeeper.rules.yml"
	// modeRulesFile is loaded beside rulesFile in the mode's deployment.
	runRulesFile     = "../prometheus/inboxkeeper-run.rules.yml"
	cronJobRulesFile = "../prometheus/inboxkeeper-cronjob.rules.yml"
	// The oldest Kubernetes the chart supports (Chart.yaml says so; it sets
	// no kubeVersion, so that a render without --kube-version works).
	kubeVersion    = "v1.29.0"
	releaseName    = "ik"
	namespace      = "db"
	fullname       = "ik-inboxkeeper"
	defaultRunbook = "https://github.com/inboxkeeper/inboxkeeper/blob/main/docs/operations/runbooks.md#"
)

// rendered is a chart rendered for one values file.
type rendered struct {
	name    string
	objects []object // the release's objects, then its hooks
	notes   string
	text    string // the manifests and the hooks' as rendered, comments included
}

func (r rendered) find(kind string) []object {
	var out []object
	for _, o := range r.objects {
		if o.kind == kind {
			out = append(out, o)
		}
	}
	return out
}

// valuesFor reads a values file of ci/ as it is: chart-testing (ct lint,
// ct install) renders each on its own, so each carries what it needs, a
// policy among it.
func valuesFor(t *testing.T, file string) map[string]any {
	t.Helper()
	vals, err := chartutil.ReadValuesFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return vals
}

// render does what `helm template ik ../helm/inboxkeeper -n db -f FILE
// --kube-version 1.29 --api-versions monitoring.coreos.com/v1` does.
func render(vals map[string]any) (*release.Release, error) {
	return renderFor(kubeVersion, vals)
}

// renderFor renders for a Kubernetes version; "" is Helm's default, what
// `helm template` assumes without --kube-version (v1.20 in a Helm built as a
// library or with go run).
func renderFor(version string, vals map[string]any) (*release.Release, error) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		return nil, err
	}
	in := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	in.DryRun = true
	in.ClientOnly = true
	in.Replace = true
	in.ReleaseName = releaseName
	in.Namespace = namespace
	if version != "" {
		kv, err := chartutil.ParseKubeVersion(version)
		if err != nil {
			return nil, err
		}
		in.KubeVersion = kv
	}
	in.APIVersions = chartutil.VersionSet{"monitoring.coreos.com/v1"}
	return in.Run(chrt, vals)
}

func renderAndDecode(t *testing.T, name string, vals map[string]any) rendered {
	t.Helper()
	return renderAndDecodeFor(t, kubeVersion, name, vals)
}

func renderAndDecodeFor(t *testing.T, version, name string, vals map[string]any) rendered {
	t.Helper()
	rel, err := renderFor(version, vals)
	if err != nil {
		t.Fatalf("%s: the chart does not render: %v", name, err)
	}
	r := rendered{name: name, notes: rel.Info.Notes, text: rel.Manifest}
	objs, err := decodeAll(name, rel.Manifest)
	if err != nil {
		t.Error(err)
	}
	r.objects = objs
	for _, h := range rel.Hooks {
		r.text += "\n" + h.Manifest
		objs, err := decodeAll(name+": "+h.Path, h.Manifest)
		if err != nil {
			t.Error(err)
		}
		r.objects = append(r.objects, objs...)
	}
	return r
}

// The chart in every mode and with every values file of ci/: it renders,
// every object decodes strictly, and each mode has what it must have.
func TestChart(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil || len(files) < 5 {
		t.Fatalf("want the values files of %s/ci, found %v: %v", chartDir, files, err)
	}
	modes := map[string]bool{}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			vals := valuesFor(t, f)
			r := renderAndDecode(t, filepath.Base(f), vals)
			mode, _ := vals["mode"].(string)
			modes[mode] = true
			checkChart(t, r, vals, mode)
			// `helm template` and ct lint without --kube-version.
			renderAndDecodeFor(t, "", filepath.Base(f)+" (no --kube-version)", vals)
		})
	}
	for _, m := range []string{"deployment", "cronjob", "sidecar"} {
		if !modes[m] {
			t.Errorf("no values file in ci/ renders mode %s", m)
		}
	}
}

func checkChart(t *testing.T, r rendered, vals map[string]any, mode string) {
	t.Helper()
	workloads := map[string]int{"Deployment": len(r.find("Deployment")), "CronJob": len(r.find("CronJob"))}
	want := map[string]map[string]int{
		"deployment": {"Deployment": 1, "CronJob": 0},
		"cronjob":    {"Deployment": 0, "CronJob": 1},
		"sidecar":    {"Deployment": 0, "CronJob": 0},
	}[mode]
	if fmt.Sprint(workloads) != fmt.Sprint(want) {
		t.Errorf("mode %s: workloads %v, want %v", mode, workloads, want)
	}
	if len(r.find("StatefulSet")) > 0 {
		t.Errorf("the chart never renders a database")
	}
	if len(r.find("Secret")) > 0 {
		t.Errorf("the chart renders a Secret; connection strings come from database.existingSecret")
	}
	for _, o := range r.find("Deployment") {
		d := o.obj.(*appsv1.Deployment)
		c := checkPod(t, o, d.Spec.Template.Spec, "run")
		checkRunProbes(t, o, c)
		if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 {
			t.Errorf("%s: want replicas 1 by default", o)
		}
		// A policy change must not roll the pod: the daemon applies a
		// changed file itself, and keeps the policy in force if it fails.
		for k := range d.Spec.Template.Annotations {
			if strings.HasPrefix(k, "checksum/") {
				t.Errorf("%s: annotation %s restarts the pod on a policy change; the daemon reloads the file", o, k)
			}
		}
	}
	cron, _ := vals["cronjob"].(map[string]any)
	gateway, _ := cron["pushgateway"].(string)
	for _, o := range r.find("CronJob") {
		checkCronJob(t, o, o.obj.(*batchv1.CronJob), gateway)
	}
	checkMigrateHook(t, r, vals)
	checkMonitoring(t, r, vals, mode)
	if mode == "sidecar" {
		checkSidecarNotes(t, r)
	}
	for _, o := range r.find("NetworkPolicy") {
		np := o.obj.(*networkingv1.NetworkPolicy)
		if !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeEgress) || !slices.Contains(np.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			t.Errorf("%s: want both Ingress and Egress policy types", o)
		}
		if len(np.Spec.Egress) == 0 {
			t.Errorf("%s: no egress rule: the daemon could not reach its database", o)
		}
		if mode == "cronjob" && gateway != "" {
			reach := false
			for _, e := range np.Spec.Egress {
				for _, p := range e.Ports {
					reach = reach || (p.Port != nil && p.Port.IntValue() == 9091)
				}
			}
			if !reach {
				t.Errorf("%s: the CronJob pushes to %s but no egress rule allows port 9091", o, gateway)
			}
		}
	}
}

// checkPod checks what every pod that runs inboxkeeper needs, and returns
// its inboxkeeper container.
func checkPod(t *testing.T, o object, spec corev1.PodSpec, command string, extraArgs ...string) corev1.Container {
	t.Helper()
	if spec.EnableServiceLinks == nil || *spec.EnableServiceLinks {
		t.Errorf("%s: want enableServiceLinks: false (service links inject unknown INBOXKEEPER_* variables)", o)
	}
	if spec.AutomountServiceAccountToken == nil || *spec.AutomountServiceAccountToken {
		t.Errorf("%s: want automountServiceAccountToken: false", o)
	}
	var c *corev1.Container
	for i := range spec.Containers {
		if spec.Containers[i].Name == "inboxkeeper" {
			c = &spec.Containers[i]
		}
	}
	if c == nil {
		t.Fatalf("%s: no inboxkeeper container", o)
	}
	if want := append([]string{command}, extraArgs...); !slices.Equal(c.Args, want) || len(c.Command) > 0 {
		t.Errorf("%s: command %q args %q, want args %q and the image's entrypoint", o, c.Command, c.Args, want)
	}
	checkRestricted(t, o.String(), spec.SecurityContext, c.SecurityContext)
	checkPolicyMount(t, o, spec, *c)
	if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() || c.Resources.Limits.Memory().IsZero() {
		t.Errorf("%s: want cpu and memory requests and a memory limit", o)
	}
	if !c.Resources.Limits.Cpu().IsZero() {
		t.Errorf("%s: no CPU limit: a throttled daemon holds its batches' row locks longer", o)
	}
	checkVariables(t, o, *c)
	db := envOf(*c, "INBOXKEEPER_DATABASE_URL")
	file := envOf(*c, "INBOXKEEPER_DATABASE_URL_FILE")
	switch {
	case db != nil && (db.Value != "" || db.ValueFrom == nil || db.ValueFrom.SecretKeyRef == nil):
		t.Errorf("%s: INBOXKEEPER_DATABASE_URL must come from a secretKeyRef", o)
	case db == nil && file == nil:
		t.Errorf("%s: neither INBOXKEEPER_DATABASE_URL nor INBOXKEEPER_DATABASE_URL_FILE", o)
	}
	return *c
}

// checkRestricted checks the Pod Security Standards' restricted profile.
func checkRestricted(t *testing.T, where string, psc *corev1.PodSecurityContext, sc *corev1.SecurityContext) {
	t.Helper()
	if sc == nil {
		t.Errorf("%s: no securityContext", where)
		return
	}
	isTrue := func(b *bool) bool { return b != nil && *b }
	if !isTrue(sc.RunAsNonRoot) && (psc == nil || !isTrue(psc.RunAsNonRoot)) {
		t.Errorf("%s: want runAsNonRoot", where)
	}
	if sc.RunAsUser == nil || *sc.RunAsUser != 65532 {
		t.Errorf("%s: want runAsUser 65532 (distroless nonroot)", where)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("%s: want allowPrivilegeEscalation: false", where)
	}
	if !isTrue(sc.ReadOnlyRootFilesystem) {
		t.Errorf("%s: want readOnlyRootFilesystem", where)
	}
	if isTrue(sc.Privileged) {
		t.Errorf("%s: privileged", where)
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) > 0 {
		t.Errorf("%s: want capabilities drop [ALL], add nothing", where)
	}
	seccomp := sc.SeccompProfile
	if seccomp == nil && psc != nil {
		seccomp = psc.SeccompProfile
	}
	if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("%s: want seccompProfile RuntimeDefault", where)
	}
}

func envOf(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

// checkPolicyMount: INBOXKEEPER_POLICY_FILE names a file that a ConfigMap
// volume mounted read-only puts there.
func checkPolicyMount(t *testing.T, o object, spec corev1.PodSpec, c corev1.Container) string {
	t.Helper()
	pf := envOf(c, "INBOXKEEPER_POLICY_FILE")
	if pf == nil || !filepath.IsAbs(pf.Value) {
		t.Errorf("%s: want INBOXKEEPER_POLICY_FILE, an absolute path", o)
		return ""
	}
	for _, m := range c.VolumeMounts {
		if m.MountPath != filepath.Dir(pf.Value) {
			continue
		}
		if !m.ReadOnly {
			t.Errorf("%s: mount the policy read-only", o)
		}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.ConfigMap != nil {
				for _, it := range v.ConfigMap.Items {
					if it.Path == filepath.Base(pf.Value) {
						return v.ConfigMap.Name
					}
				}
				t.Errorf("%s: ConfigMap volume %s has no item at %s", o, v.Name, filepath.Base(pf.Value))
				return ""
			}
		}
	}
	t.Errorf("%s: INBOXKEEPER_POLICY_FILE=%s, but no ConfigMap volume is mounted at %s", o, pf.Value, filepath.Dir(pf.Value))
	return ""
}

func checkRunProbes(t *testing.T, o object, c corev1.Container) {
	t.Helper()
	addr := envOf(c, "INBOXKEEPER_METRICS_ADDR")
	if addr == nil || !strings.HasPrefix(addr.Value, "0.0.0.0:") {
		t.Errorf("%s: want INBOXKEEPER_METRICS_ADDR on 0.0.0.0 (the kubelet probes the pod IP)", o)
		return
	}
	var port int32
	for _, p := range c.Ports {
		if p.Name == "metrics" {
			port = p.ContainerPort
		}
	}
	if fmt.Sprintf("0.0.0.0:%d", port) != addr.Value {
		t.Errorf("%s: containerPort metrics %d, but INBOXKEEPER_METRICS_ADDR=%s", o, port, addr.Value)
	}
	for name, pr := range map[string]*corev1.Probe{"/livez": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if pr == nil || pr.HTTPGet == nil || pr.HTTPGet.Path != name || pr.HTTPGet.Port.String() != "metrics" {
			t.Errorf("%s: want a probe httpGet %s on port metrics, got %+v", o, name, pr)
		}
	}
	if c.StartupProbe != nil {
		t.Errorf("%s: no startupProbe: a native sidecar's holds back its database", o)
	}
}

func checkCronJob(t *testing.T, o object, cj *batchv1.CronJob, pushgateway string) {
	t.Helper()
	if cj.Spec.ConcurrencyPolicy != batchv1.ForbidConcurrent {
		t.Errorf("%s: want concurrencyPolicy Forbid", o)
	}
	js := cj.Spec.JobTemplate.Spec
	var extra []string
	if pushgateway != "" {
		// A stable instance: each run's pod has a new host name.
		extra = []string{"--pushgateway", pushgateway, "--push-instance", fullname}
	}
	c := checkPod(t, o, js.Template.Spec, "once", extra...)
	checkFailsOnExit2(t, o, js)
	rt := envOf(c, "INBOXKEEPER_RUN_TIME")
	if rt == nil || js.ActiveDeadlineSeconds == nil {
		t.Fatalf("%s: want INBOXKEEPER_RUN_TIME and activeDeadlineSeconds", o)
	}
	d, err := time.ParseDuration(rt.Value)
	if err != nil || d >= time.Duration(*js.ActiveDeadlineSeconds)*time.Second {
		t.Errorf("%s: INBOXKEEPER_RUN_TIME %s must end the pass before activeDeadlineSeconds %d", o, rt.Value, *js.ActiveDeadlineSeconds)
	}
}

// checkFailsOnExit2: exit 2 is a configuration error, which a retry does
// not fix. Only a podFailurePolicy, with restartPolicy Never, says so.
func checkFailsOnExit2(t *testing.T, o object, js batchv1.JobSpec) {
	t.Helper()
	if js.Template.Spec.RestartPolicy != corev1.RestartPolicyNever {
		t.Errorf("%s: restartPolicy %q, want Never (podFailurePolicy needs it)", o, js.Template.Spec.RestartPolicy)
	}
	ok := false
	if js.PodFailurePolicy != nil {
		for _, r := range js.PodFailurePolicy.Rules {
			e := r.OnExitCodes
			if r.Action == batchv1.PodFailurePolicyActionFailJob && e != nil && e.Operator == batchv1.PodFailurePolicyOnExitCodesOpIn &&
				slices.Contains(e.Values, 2) && (e.ContainerName == nil || *e.ContainerName == "inboxkeeper") {
				ok = true
			}
		}
	}
	if !ok {
		t.Errorf("%s: want a podFailurePolicy rule FailJob onExitCodes In [2]", o)
	}
}

// checkMigrateHook: a pre-install/pre-upgrade Job runs migrate as the owner,
// with the policy mounted from a ConfigMap that exists when it runs.
func checkMigrateHook(t *testing.T, r rendered, vals map[string]any) {
	t.Helper()
	var jobs []object
	for _, o := range r.find("Job") {
		jobs = append(jobs, o)
	}
	if len(jobs) != 1 {
		t.Fatalf("want one Job (the migrate hook), found %d", len(jobs))
	}
	o := jobs[0]
	if o.hook != "pre-install,pre-upgrade" {
		t.Errorf("%s: helm.sh/hook %q, want pre-install,pre-upgrade", o, o.hook)
	}
	job := o.obj.(*batchv1.Job)
	spec := job.Spec.Template.Spec
	c := checkPod(t, o, spec, "migrate")
	checkFailsOnExit2(t, o, job.Spec)
	db := envOf(c, "INBOXKEEPER_DATABASE_URL")
	if db == nil || db.ValueFrom == nil || db.ValueFrom.SecretKeyRef == nil || db.ValueFrom.SecretKeyRef.Key != "migrate-database-url" {
		t.Errorf("%s: want INBOXKEEPER_DATABASE_URL from the owner's key migrate-database-url", o)
	}
	cm := checkPolicyMount(t, o, spec, c)
	policy, _ := vals["policy"].(map[string]any)
	if existing, _ := policy["existingConfigMap"].(string); existing != "" {
		if cm != existing {
			t.Errorf("%s: mounts ConfigMap %q, want the existing %q", o, cm, existing)
		}
		return
	}
	// An inline policy: the ConfigMap must be a hook too, created first.
	for _, h := range r.find("ConfigMap") {
		if h.name != cm {
			continue
		}
		if h.hook != "pre-install,pre-upgrade" {
			t.Errorf("%s: the migrate hook mounts ConfigMap %s, which is not a pre-install hook: it would not exist yet", o, cm)
		}
		data := h.obj.(*corev1.ConfigMap).Data
		if want, _ := policy["inline"].(string); strings.TrimSpace(data["inboxkeeper.yaml"]) != strings.TrimSpace(want) {
			t.Errorf("%s: ConfigMap %s does not hold policy.inline", o, cm)
		}
		return
	}
	t.Errorf("%s: mounts ConfigMap %q, which the chart does not render", o, cm)
}

func checkMonitoring(t *testing.T, r rendered, vals map[string]any, mode string) {
	t.Helper()
	enabled := func(key string) bool {
		m, _ := vals[key].(map[string]any)
		b, _ := m["enabled"].(bool)
		return b
	}
	if got := len(r.find("PodMonitor")); got != map[bool]int{true: 1, false: 0}[enabled("podMonitor")] {
		t.Errorf("%d PodMonitors, want one exactly when podMonitor.enabled", got)
	}
	for _, o := range r.find("PodMonitor") {
		pm := o.obj.(*monitoringv1.PodMonitor)
		if len(pm.Spec.PodMetricsEndpoints) != 1 || pm.Spec.PodMetricsEndpoints[0].Port == nil || *pm.Spec.PodMetricsEndpoints[0].Port != "metrics" {
			t.Errorf("%s: want one endpoint on port metrics", o)
		}
		if mode == "deployment" && pm.Spec.Selector.MatchLabels["app.kubernetes.io/instance"] != releaseName {
			t.Errorf("%s: selects %v, not the release's pods", o, pm.Spec.Selector.MatchLabels)
		}
	}
	if got := len(r.find("ServiceMonitor")); got != map[bool]int{true: 1, false: 0}[enabled("serviceMonitor")] {
		t.Errorf("%d ServiceMonitors, want one exactly when serviceMonitor.enabled", got)
	}
	for _, o := range r.find("Service") {
		if o.name == "inboxkeeper" {
			t.Errorf("%s: a Service named inboxkeeper injects INBOXKEEPER_SERVICE_HOST into every pod of the namespace", o)
		}
	}
	rules := r.find("PrometheusRule")
	if len(rules) != map[bool]int{true: 1, false: 0}[enabled("prometheusRule")] {
		t.Fatalf("%d PrometheusRules, want one exactly when prometheusRule.enabled", len(rules))
	}
	for _, o := range rules {
		checkPrometheusRule(t, o, o.obj.(*monitoringv1.PrometheusRule), vals, mode)
	}
}

// checkPrometheusRule: the alerts are those of the rules files the mode
// loads (inboxkeeper.rules.yml and the mode's), with only selectors,
// thresholds and runbook links changed, and promtool accepts them.
func checkPrometheusRule(t *testing.T, o object, pr *monitoringv1.PrometheusRule, vals map[string]any, mode string) {
	t.Helper()
	alerts := func(s monitoringv1.PrometheusRuleSpec) map[string]monitoringv1.Rule {
		m := map[string]monitoringv1.Rule{}
		for _, g := range s.Groups {
			for _, r := range g.Rules {
				m[r.Alert] = r // the two severities of one alert: the last
			}
		}
		return m
	}
	modeFile, other := runRulesFile, cronJobRulesFile
	if mode == "cronjob" {
		modeFile, other = cronJobRulesFile, runRulesFile
	}
	want := map[string]monitoringv1.Rule{}
	for _, f := range []string{rulesFile, modeFile} {
		maps.Copy(want, alerts(readRulesFile(t, f)))
	}
	got := alerts(pr.Spec)
	for name := range want {
		if _, ok := got[name]; !ok {
			t.Errorf("%s: alert %s of %s is not rendered in mode %s", o, name, modeFile, mode)
		}
	}
	for name := range alerts(readRulesFile(t, other)) {
		if _, ok := got[name]; ok {
			t.Errorf("%s: alert %s of %s is rendered in mode %s: it fires on every healthy deployment of the mode", o, name, other, mode)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("%s: alert %s is rendered but in neither %s nor %s", o, name, rulesFile, modeFile)
		}
	}
	p, _ := vals["prometheusRule"].(map[string]any)
	base, _ := p["runbookBaseURL"].(string)
	if base == "" {
		base = defaultRunbook
	}
	for name, r := range got {
		if r.Annotations["runbook_url"] != base+strings.ToLower(name) {
			t.Errorf("%s: %s runbook_url %q, want %q", o, name, r.Annotations["runbook_url"], base+strings.ToLower(name))
		}
		if w, ok := want[name]; ok && name != "InboxkeeperAbsent" && name != "InboxkeeperCronJobNotSucceeding" && w.Expr.String() != r.Expr.String() {
			t.Errorf("%s: %s's expression differs from the rules file's", o, name)
		}
	}
	if r, ok := got["InboxkeeperAbsent"]; ok {
		sel, _ := p["absentSelector"].(string)
		if sel == "" {
			sel = `job="` + namespace + "/" + fullname + `"` // the PodMonitor's job
			if pm, _ := vals["podMonitor"].(map[string]any); pm["enabled"] != true {
				sel = `job="` + fullname + `-metrics"`
			}
		}
		if !strings.Contains(r.Expr.String(), "up{"+sel+"}") {
			t.Errorf("%s: InboxkeeperAbsent's expression %q does not select %s", o, r.Expr.String(), sel)
		}
		if d := r.Annotations["description"]; !strings.Contains(d, "matching {"+sel+"}") || strings.Contains(d, "job inboxkeeper") {
			t.Errorf("%s: InboxkeeperAbsent's description does not name the selector %s: %q", o, sel, d)
		}
	}
	if r, ok := got["InboxkeeperCronJobNotSucceeding"]; ok {
		sel, _ := p["cronJobSelector"].(string)
		if sel == "" {
			sel = fmt.Sprintf(`namespace=%q, cronjob=%q`, namespace, fullname)
		}
		if strings.Count(r.Expr.String(), "{"+sel+"}") != 2 {
			t.Errorf("%s: InboxkeeperCronJobNotSucceeding's expression %q does not select %s twice", o, r.Expr.String(), sel)
		}
	}
	// promtool checks the rendered PromQL.
	out, err := yaml.Marshal(pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "rendered.rules.yml")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		t.Fatal(err)
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool is not installed (apt-get install prometheus; .ci/run does): %v", err)
	}
	if b, err := exec.Command(promtool, "check", "rules", path).CombinedOutput(); err != nil {
		t.Errorf("%s: promtool check rules on the rendered rules: %v\n%s\n%s", o, err, b, out)
	}
}

// checkSidecarNotes: in sidecar mode the NOTES carry the container spec to
// add to the database pod. It decodes as a Container and is a native sidecar.
func checkSidecarNotes(t *testing.T, r rendered) {
	t.Helper()
	_, rest, ok := strings.Cut(r.notes, "# --- sidecar container ---\n")
	spec, vol, ok2 := strings.Cut(rest, "# --- sidecar volume ---\n")
	vol, _, ok3 := strings.Cut(vol, "# --- end ---")
	if !ok || !ok2 || !ok3 {
		t.Fatalf("sidecar mode: the NOTES lack the container spec between its markers:\n%s", r.notes)
	}
	var c corev1.Container
	if err := yaml.UnmarshalStrict([]byte(spec), &c); err != nil {
		t.Fatalf("sidecar mode: the container spec in the NOTES does not decode: %v\n%s", err, spec)
	}
	var vols []corev1.Volume
	if err := yaml.UnmarshalStrict([]byte(vol), &vols); err != nil || len(vols) != 1 {
		t.Fatalf("sidecar mode: the volume in the NOTES does not decode: %v\n%s", err, vol)
	}
	o := object{where: "NOTES.txt", kind: "Container", name: c.Name}
	if c.RestartPolicy == nil || *c.RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Errorf("%s: want restartPolicy Always (a native sidecar)", o)
	}
	if !slices.Equal(c.Args, []string{"run"}) {
		t.Errorf("%s: args %q, want [run]", o, c.Args)
	}
	checkRestricted(t, o.String(), nil, c.SecurityContext)
	checkVariables(t, o, c)
	checkRunProbes(t, o, c)
	checkPolicyMount(t, o, corev1.PodSpec{Volumes: vols}, c)
	if db := envOf(c, "INBOXKEEPER_DATABASE_URL"); db == nil || db.ValueFrom == nil || db.ValueFrom.SecretKeyRef.Key != "sidecar-database-url" {
		t.Errorf("%s: want INBOXKEEPER_DATABASE_URL from the loopback key sidecar-database-url", o)
	}
}

// Values that cannot work fail the render with a message that says why.
func TestChartRefuses(t *testing.T) {
	for name, tc := range map[string]struct {
		vals map[string]any
		want string
	}{
		"no policy":                {map[string]any{}, "set policy.inline"},
		"unknown mode":             {map[string]any{"mode": "daemonset", "policy": map[string]any{"inline": "x"}}, "value must be one of 'deployment', 'cronjob', 'sidecar'"},
		"misspelt section":         {map[string]any{"policy": map[string]any{"inline": "x"}, "podMonitr": map[string]any{"enabled": true}}, "podMonitr"},
		"misspelt key":             {map[string]any{"policy": map[string]any{"inline": "x"}, "prometheusRule": map[string]any{"enable": true}}, "enable"},
		"env not INBOXKEEPER_":     {map[string]any{"policy": map[string]any{"inline": "x"}, "env": map[string]any{"GOMEMLIMIT": "1GiB"}}, "GOMEMLIMIT"},
		"misspelt variable":        {map[string]any{"policy": map[string]any{"inline": "x"}, "env": map[string]any{"INBOXKEEPER_BATCH_SIZ": 500}}, "INBOXKEEPER_BATCH_SIZ"},
		"podMonitor of a CronJob":  {map[string]any{"mode": "cronjob", "policy": map[string]any{"inline": "x"}, "podMonitor": map[string]any{"enabled": true}}, "serves no metrics"},
		"env sets the policy file": {map[string]any{"policy": map[string]any{"inline": "x"}, "env": map[string]any{"INBOXKEEPER_POLICY_FILE": "/x"}}, "the chart sets it"},
		"sidecar without selector": {map[string]any{"mode": "sidecar", "policy": map[string]any{"inline": "x"}, "podMonitor": map[string]any{"enabled": true}}, "podMonitor.selector"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := render(tc.vals)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("render(%v) = %v, want an error with %q", tc.vals, err, tc.want)
			}
		})
	}
}

// helm lint --strict with each values file of ci/, as ct lint runs it: no
// --kube-version, nothing added.
func TestChartLint(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(chartDir, "ci", "*-values.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no values files in %s/ci: %v", chartDir, err)
	}
	for _, f := range files {
		res := action.NewLint()
		res.Strict = true
		res.Namespace = namespace
		out := res.Run([]string{chartDir}, valuesFor(t, f))
		for _, m := range out.Messages {
			t.Logf("lint %s: %s", filepath.Base(f), m)
		}
		if len(out.Errors) > 0 {
			t.Errorf("helm lint --strict -f %s: %v", f, out.Errors)
		}
	}
}

// The chart asks for no Kubernetes version: it renders for an old one, and
// leaves out what that one lacks instead of refusing. A Job's
// podFailurePolicy needs 1.26; a native sidecar 1.29, which the sidecar
// NOTES then say.
func TestChartGatesOnKubeVersion(t *testing.T) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	if chrt.Metadata.KubeVersion != "" {
		t.Errorf("Chart.yaml: kubeVersion %q makes helm template without --kube-version fail; gate on .Capabilities.KubeVersion instead", chrt.Metadata.KubeVersion)
	}
	cron := valuesFor(t, filepath.Join(chartDir, "ci", "cronjob-values.yaml"))
	// "": helm template without --kube-version, which assumes an old one.
	for version, want := range map[string]bool{"": false, "v1.25.0": false, "v1.26.0": true, kubeVersion: true} {
		r := renderAndDecodeFor(t, version, "cronjob-values.yaml at "+version, cron)
		// The comments say what was rendered: none promises a policy
		// that is not there.
		promises := regexp.MustCompile(`(?m)^\s*#.*(fails the Job at once|no retry)`).FindAllString(r.text, -1)
		warns := strings.Contains(r.text, "has no podFailurePolicy")
		if want && (warns || len(promises) == 0) || !want && (!warns || len(promises) > 0) {
			t.Errorf("Kubernetes %q: a podFailurePolicy is rendered: %v, but the comments promise it %q and warn of its absence: %v\n%s", version, want, promises, warns, r.text)
		}
		for _, o := range r.objects {
			var js *batchv1.JobSpec
			switch obj := o.obj.(type) {
			case *batchv1.CronJob:
				js = &obj.Spec.JobTemplate.Spec
			case *batchv1.Job:
				js = &obj.Spec
			default:
				continue
			}
			if got := js.PodFailurePolicy != nil; got != want {
				t.Errorf("Kubernetes %s: %s has a podFailurePolicy: %v, want %v", version, o, got, want)
			}
		}
	}
	sidecar := valuesFor(t, filepath.Join(chartDir, "ci", "sidecar-values.yaml"))
	for version, warn := range map[string]bool{"v1.28.0": true, kubeVersion: false} {
		r := renderAndDecodeFor(t, version, "sidecar-values.yaml at "+version, sidecar)
		if got := strings.Contains(r.notes, "no native sidecars"); got != warn {
			t.Errorf("Kubernetes %s: the sidecar NOTES warn about native sidecars: %v, want %v\n%s", version, got, warn, r.notes)
		}
	}
}

// appVersion, the image tag a release runs by default, is the release's
// version (release.sh sets it, TestReleaseScript checks), never a moving tag.
func TestChartAppVersion(t *testing.T) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		t.Fatal(err)
	}
	if want := "v" + chrt.Metadata.Version; chrt.Metadata.AppVersion != want {
		t.Errorf("Chart.yaml: appVersion %q, want %q (the release of chart version %s)", chrt.Metadata.AppVersion, want, chrt.Metadata.Version)
	}
	r := renderAndDecode(t, "deployment-values.yaml", valuesFor(t, filepath.Join(chartDir, "ci", "deployment-values.yaml")))
	for _, o := range r.find("Deployment") {
		img := o.obj.(*appsv1.Deployment).Spec.Template.Spec.Containers[0].Image
		if want := "ghcr.io/inboxkeeper/inboxkeeper:" + chrt.Metadata.AppVersion; img != want {
			t.Errorf("%s: image %s, want %s", o, img, want)
		}
	}
}

// values.schema.json's env section names exactly the variables the daemon
// knows (`inboxkeeper help env`): deploy/schema_test.go generates it from
// internal/platform/config, and this checks the result against the binary.
func TestChartSchemaVariables(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			Env struct {
				AdditionalProperties *bool                     `json:"additionalProperties"`
				Properties           map[string]map[string]any `json:"properties"`
			} `json:"env"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(b, &schema); err != nil {
		t.Fatal(err)
	}
	env := schema.Properties.Env
	if env.AdditionalProperties == nil || *env.AdditionalProperties {
		t.Errorf("values.schema.json: env must set additionalProperties: false, or a misspelt variable gets through")
	}
	known := knownVariables(t)
	for name := range env.Properties {
		if !known[name] {
			t.Errorf("values.schema.json: env.%s is not a variable inboxkeeper knows", name)
		}
	}
	for name := range known {
		if _, ok := env.Properties[name]; !ok {
			t.Errorf("values.schema.json: env lacks %s, which inboxkeeper help env lists", name)
		}
	}
}

// readRulesFile decodes a rules file as a PrometheusRule's spec.
func readRulesFile(t *testing.T, path string) monitoringv1.PrometheusRuleSpec {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var file monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(b, &file); err != nil {
		t.Fatalf("%s does not decode as a PrometheusRule's spec: %v", path, err)
	}
	return file
}
