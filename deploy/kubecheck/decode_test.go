package kubecheck

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// object is one decoded Kubernetes document.
type object struct {
	where string // file or template, and the document's index
	kind  string
	name  string
	obj   any // a pointer to the API type
	hook  string
}

func (o object) String() string { return fmt.Sprintf("%s: %s %s", o.where, o.kind, o.name) }

// kinds maps apiVersion/kind to the API type every document of that kind
// is decoded into. A kind missing here is an error: nothing goes unchecked.
var kinds = map[string]func() any{
	"v1/ConfigMap":                            func() any { return &corev1.ConfigMap{} },
	"v1/Secret":                               func() any { return &corev1.Secret{} },
	"v1/Service":                              func() any { return &corev1.Service{} },
	"apps/v1/Deployment":                      func() any { return &appsv1.Deployment{} },
	"apps/v1/StatefulSet":                     func() any { return &appsv1.StatefulSet{} },
	"batch/v1/Job":                            func() any { return &batchv1.Job{} },
	"batch/v1/CronJob":                        func() any { return &batchv1.CronJob{} },
	"networking.k8s.io/v1/NetworkPolicy":      func() any { return &networkingv1.NetworkPolicy{} },
	"monitoring.coreos.com/v1/PodMonitor":     func() any { return &monitoringv1.PodMonitor{} },
	"monitoring.coreos.com/v1/ServiceMonitor": func() any { return &monitoringv1.ServiceMonitor{} },
	"monitoring.coreos.com/v1/PrometheusRule": func() any { return &monitoringv1.PrometheusRule{} },
	"postgresql.cnpg.io/v1/Cluster":           func() any { return &cnpgCluster{} },
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// decodeAll strictly decodes every document of a multi-document YAML text:
// an unknown or misspelt field, a duplicate key or a wrong type fails.
func decodeAll(where, text string) ([]object, error) {
	var out []object
	var errs []string
	for i, doc := range docSeparator.Split(text, -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		o, err := decodeOne(fmt.Sprintf("%s#%d", where, i), []byte(doc))
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		out = append(out, o)
	}
	if len(errs) > 0 {
		return out, fmt.Errorf("%s", strings.Join(errs, "\n"))
	}
	return out, nil
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, l := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(l), "#") {
			b.WriteString(l + "\n")
		}
	}
	return b.String()
}

func decodeOne(where string, doc []byte) (object, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return object{}, fmt.Errorf("%s: %v", where, err)
	}
	gvk := tm.APIVersion + "/" + tm.Kind
	newObj, ok := kinds[gvk]
	if !ok {
		return object{}, fmt.Errorf("%s: %s is not a kind this check knows; add its API type to kinds", where, gvk)
	}
	obj := newObj()
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return object{}, fmt.Errorf("%s: %s: %v", where, gvk, err)
	}
	var meta struct {
		Metadata metav1.ObjectMeta `json:"metadata"`
	}
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		return object{}, fmt.Errorf("%s: %v", where, err)
	}
	if meta.Metadata.Name == "" {
		return object{}, fmt.Errorf("%s: %s without metadata.name", where, gvk)
	}
	return object{where: where, kind: tm.Kind, name: meta.Metadata.Name, obj: obj, hook: meta.Metadata.Annotations["helm.sh/hook"]}, nil
}

// The checker itself: a misspelt field fails, a known one passes.
func TestStrictDecoding(t *testing.T) {
	good := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata:\n  a: b\n"
	if _, err := decodeAll("good", good); err != nil {
		t.Errorf("a valid ConfigMap: %v", err)
	}
	for name, bad := range map[string]string{
		"unknown field": "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: x\nspec:\n  replica: 1\n",
		"wrong type":    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata: [1]\n",
		"unknown kind":  "apiVersion: v1\nkind: Pod\nmetadata:\n  name: x\n",
		"no name":       "apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n",
		"duplicate key": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n  name: y\n",
	} {
		if _, err := decodeAll(name, bad); err == nil {
			t.Errorf("%s: decoded without an error", name)
		}
	}
}

// Every file in deploy/kubernetes, the operator examples included.
func TestKubernetesManifestsDecode(t *testing.T) {
	var files []string
	err := filepath.WalkDir("../kubernetes", func(p string, d os.DirEntry, err error) error {
		// values.yaml files are the Helm chart's values, not objects.
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".yaml") && filepath.Base(p) != "values.yaml" {
			files = append(files, p)
		}
		return err
	})
	if err != nil || len(files) < 6 {
		t.Fatalf("want the manifests of deploy/kubernetes, found %v: %v", files, err)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		objs, err := decodeAll(f, string(b))
		if err != nil {
			t.Error(err)
		}
		if len(objs) == 0 {
			t.Errorf("%s: no Kubernetes object", f)
		}
	}
}
