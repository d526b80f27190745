// Package gitops checks, against a real apiserver, that the status the
// uuid-controller writes is what GitOps tools read: kstatus
// (sigs.k8s.io/cli-utils/pkg/kstatus), which Flux's health checks build on.
// It is a module of its own so kstatus and its dependencies stay out of
// the controller's go.mod. It still shares test/cluster and test/framework
// with test/e2e (its replace points at the main module), so it keeps no
// copy of their helpers: the import goes one way only.
package gitops
