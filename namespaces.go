package main

import (
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	"github.com/demo-operator/uuid-controller/internal/nscheck"
)

// splitNamespaces reads --namespace: a comma-separated list of namespace
// names, each a DNS-1123 label, none twice and none empty; "" (the
// default) is nil, every namespace. A bad list fails at start-up rather
// than as a list that never succeeds, with the controller never ready.
func splitNamespaces(value string) ([]string, []error) {
	if value == "" {
		return nil, nil
	}
	var (
		names []string
		errs  []error
		seen  = map[string]bool{}
	)
	for i, name := range strings.Split(value, ",") {
		switch {
		case name == "":
			errs = append(errs, fmt.Errorf("--namespace %q: item %d is empty", value, i+1))
		case seen[name]:
			errs = append(errs, fmt.Errorf("--namespace %q: %q is listed twice", value, name))
		default:
			seen[name] = true
			names = append(names, name)
			errs = append(errs, checkName("--namespace", name, validation.IsDNS1123Label)...)
		}
	}
	return names, errs
}

// newNamespaceCheck is the check of the namespaces --namespace lists
// (internal/nscheck), nil when every namespace is watched: a cluster-wide
// controller has no namespace of its own to miss. reg prefixes its gauge's
// name with uuid_controller_ (Metrics.Registerer).
func newNamespaceCheck(names []string, kube kubernetes.Interface, reg prometheus.Registerer) (*nscheck.Checker, error) {
	if len(names) == 0 {
		return nil, nil
	}
	return nscheck.New(nscheck.Config{Namespaces: kube.CoreV1().Namespaces(), Names: names,
		Registerer: reg})
}
