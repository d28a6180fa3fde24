package kubecheck

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
