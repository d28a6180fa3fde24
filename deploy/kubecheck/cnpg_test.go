package kubecheck

import (
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// cnpgCluster is the part of CloudNativePG's Cluster (postgresql.cnpg.io/v1)
// that deploy/kubernetes/cloudnative-pg uses. CloudNativePG publishes its API
// types only inside the operator's module, far too heavy to import here, so
// this is a copy of the subset, with the same JSON names. Strict decoding
// still fails on a misspelt field; a field the example starts to use must be
// added here, from the operator's API reference.
type cnpgCluster struct {
	metav1.TypeMeta `json:",inline"`
	Metadata        metav1.ObjectMeta `json:"metadata"`
	Spec            struct {
		Instances int    `json:"instances"`
		ImageName string `json:"imageName,omitempty"`
		Storage   struct {
			Size string `json:"size"`
		} `json:"storage"`
		Bootstrap *struct {
			InitDB *struct {
				Database string `json:"database"`
				Owner    string `json:"owner"`
			} `json:"initdb"`
		} `json:"bootstrap,omitempty"`
		Managed *struct {
			Roles []struct {
				Name            string   `json:"name"`
				Ensure          string   `json:"ensure,omitempty"`
				Comment         string   `json:"comment,omitempty"`
				Login           bool     `json:"login,omitempty"`
				InRoles         []string `json:"inRoles,omitempty"`
				ConnectionLimit *int64   `json:"connectionLimit,omitempty"`
				PasswordSecret  *struct {
					Name string `json:"name"`
				} `json:"passwordSecret,omitempty"`
			} `json:"roles"`
		} `json:"managed,omitempty"`
	} `json:"spec"`
}

const cnpgDir = "../kubernetes/cloudnative-pg"

// The CloudNativePG example holds together: the chart with its values.yaml
// runs the daemon as a managed LOGIN role of the cluster, member of role.sql's
// `inboxkeeper`, through the cluster's read-write Service; migrate runs as
// the owner through the operator's app Secret; the NetworkPolicy lets the
// daemon reach the cluster's pods; and the metrics carry the database label.
func TestCloudNativePGExample(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(cnpgDir, "cluster.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := decodeAll("cluster.yaml", string(b))
	if err != nil {
		t.Fatal(err)
	}
	var cluster *cnpgCluster
	secrets := map[string]*corev1.Secret{}
	for _, o := range objs {
		switch v := o.obj.(type) {
		case *cnpgCluster:
			cluster = v
			cluster.Metadata.Name = o.name
		case *corev1.Secret:
			secrets[o.name] = v
		}
	}
	if cluster == nil || cluster.Spec.Managed == nil || cluster.Spec.Bootstrap == nil || cluster.Spec.Bootstrap.InitDB == nil {
		t.Fatal("cluster.yaml: want a Cluster with initdb and managed roles")
	}
	name, owner, dbName := cluster.Metadata.Name, cluster.Spec.Bootstrap.InitDB.Owner, cluster.Spec.Bootstrap.InitDB.Database
	roles := map[string][]string{}
	login := map[string]string{} // LOGIN role -> its password Secret
	for _, r := range cluster.Spec.Managed.Roles {
		roles[r.Name] = r.InRoles
		if r.Login && r.PasswordSecret != nil {
			login[r.Name] = r.PasswordSecret.Name
		}
	}
	// role.sql's three roles with its memberships, made by the operator.
	for role, in := range map[string]string{"inboxkeeper": "pg_read_all_stats", "inboxkeeper_operator": "inboxkeeper"} {
		if !slices.Contains(roles[role], in) {
			t.Errorf("cluster.yaml: managed role %s must be in %s (deploy/sql/role.sql grants it; the owner cannot)", role, in)
		}
	}
	if _, ok := roles["inboxkeeper_consumer"]; !ok {
		t.Errorf("cluster.yaml: no managed role inboxkeeper_consumer")
	}

	// As cluster.yaml installs it: -f values.yaml --set-file policy.inline=...
	vals := valuesFor(t, filepath.Join(cnpgDir, "values.yaml"))
	policy, err := os.ReadFile("../docker/inboxkeeper.yaml")
	if err != nil {
		t.Fatal(err)
	}
	vals["policy"] = map[string]any{"inline": string(policy)}
	rel, err := render(vals)
	if err != nil {
		t.Fatalf("the chart with %s/values.yaml: %v", cnpgDir, err)
	}
	r := rendered{name: "cloudnative-pg"}
	if r.objects, err = decodeAll("cloudnative-pg", rel.Manifest); err != nil {
		t.Error(err)
	}
	for _, h := range rel.Hooks {
		objs, err := decodeAll("cloudnative-pg: "+h.Path, h.Manifest)
		if err != nil {
			t.Error(err)
		}
		r.objects = append(r.objects, objs...)
	}

	deps := r.find("Deployment")
	if len(deps) != 1 {
		t.Fatalf("want one Deployment, got %d", len(deps))
	}
	c := checkPod(t, deps[0], deps[0].obj.(*appsv1.Deployment).Spec.Template.Spec, "run")
	ref := envOf(c, "INBOXKEEPER_DATABASE_URL").ValueFrom.SecretKeyRef
	sec, ok := secrets[ref.Name]
	if !ok {
		t.Fatalf("the daemon's Secret %s is not in cluster.yaml", ref.Name)
	}
	u, err := url.Parse(sec.StringData[ref.Key])
	if err != nil {
		t.Fatalf("Secret %s key %s: %v", ref.Name, ref.Key, err)
	}
	if u.Hostname() != name+"-rw" || strings.TrimPrefix(u.Path, "/") != dbName {
		t.Errorf("the daemon connects to %s/%s, want the primary's Service %s-rw and database %s", u.Host, u.Path, name, dbName)
	}
	user := u.User.Username()
	if pw, ok := login[user]; !ok || !slices.Contains(roles[user], "inboxkeeper") {
		t.Errorf("the daemon's user %s is not a managed LOGIN role in inboxkeeper", user)
	} else if basic := secrets[pw]; basic == nil || basic.Type != corev1.SecretTypeBasicAuth || basic.StringData["username"] != user {
		t.Errorf("managed role %s: password Secret %s must be a basic-auth Secret for that user", user, pw)
	}
	if user == "inboxkeeper" || user == owner {
		t.Errorf("the daemon must not connect as %s", user)
	}

	job := r.find("Job")
	if len(job) != 1 {
		t.Fatalf("want the migrate hook, got %d Jobs", len(job))
	}
	mc := checkPod(t, job[0], job[0].obj.(*batchv1.Job).Spec.Template.Spec, "migrate")
	if m := envOf(mc, "INBOXKEEPER_DATABASE_URL").ValueFrom.SecretKeyRef; m.Name != name+"-app" || m.Key != "uri" {
		t.Errorf("migrate uses Secret %s key %s, want the operator's %s-app key uri (the owner %s)", m.Name, m.Key, name, owner)
	}

	nps := r.find("NetworkPolicy")
	if len(nps) != 1 {
		t.Fatalf("want a NetworkPolicy, got %d", len(nps))
	}
	reaches := false
	for _, e := range nps[0].obj.(*networkingv1.NetworkPolicy).Spec.Egress {
		for _, to := range e.To {
			if to.PodSelector != nil && to.PodSelector.MatchLabels["cnpg.io/cluster"] == name {
				reaches = true
			}
		}
	}
	if !reaches {
		t.Errorf("the NetworkPolicy does not let the daemon reach the pods of cluster %s", name)
	}
	pms := r.find("PodMonitor")
	if len(pms) != 1 {
		t.Fatalf("want a PodMonitor, got %d", len(pms))
	}
	labelled := false
	for _, rl := range pms[0].obj.(*monitoringv1.PodMonitor).Spec.PodMetricsEndpoints[0].RelabelConfigs {
		if rl.TargetLabel == "database" && rl.Replacement != nil && *rl.Replacement == name {
			labelled = true
		}
	}
	if !labelled {
		t.Errorf("the PodMonitor does not set database=%q", name)
	}
}
