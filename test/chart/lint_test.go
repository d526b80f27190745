package chart

import (
	"strings"
	"testing"
)

// TestChartLint: `helm lint --strict` passes with default values, with
// the kopf migration on, and with monitoring on.
func TestChartLint(t *testing.T) {
	for _, set := range [][]string{nil, {"--set", "kopfMigration.enabled=true"}, {"--set", "monitoring.enabled=true"}} {
		out, errOut, err := run(t, "helm", append([]string{"lint", "--strict", chartDir}, set...)...)
		if err != nil || !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") {
			t.Errorf("helm lint --strict %v: %v\n%s%s", set, err, out, errOut)
		}
	}
}

// TestChartRefusesBadValues: a wrong value fails `helm template` (as it
// fails `helm install`, before anything reaches the cluster) with a
// message naming the value and what it must be.
func TestChartRefusesBadValues(t *testing.T) {
	tests := []struct {
		name string
		set  []string // --set or --set-string arguments
		want []string // in the error, each
	}{
		{"replicas not a number", []string{"--set-string", "replicas=two"},
			[]string{"/replicas", "got string, want integer"}},
		{"no replicas", []string{"--set", "replicas=0"},
			[]string{"/replicas", "minimum"}},
		{"unknown pull policy", []string{"--set", "image.pullPolicy=Sometimes"},
			[]string{"/image/pullPolicy", "Always", "IfNotPresent", "Never"}},
		{"digest without its algorithm", []string{"--set", "image.digest=0123abcd"},
			[]string{"/image/digest", "does not match pattern"}},
		{"tag in the repository", []string{"--set", "image.repository=uuid-controller:v1"},
			[]string{"/image/repository", "does not match pattern"}},
		{"misspelt top-level value", []string{"--set", "replica=3"},
			[]string{"additional properties 'replica' not allowed"}},
		{"misspelt nested value", []string{"--set", "metrics.secured=false"},
			[]string{"/metrics", "additional properties 'secured' not allowed"}},
		{"verbosity below 0", []string{"--set", "logVerbosity=-1"},
			[]string{"/logVerbosity", "minimum"}},
		{"metrics port out of range", []string{"--set", "metrics.port=70000"},
			[]string{"/metrics/port", "maximum"}},
		{"metrics port on the health port", []string{"--set", "metrics.port=8080"},
			[]string{"metrics.port: 8080 is the health port"}},
		{"memory limit not a quantity", []string{"--set", "resources.limits.memory=lots"},
			[]string{"/resources/limits/memory", "does not match pattern"}},
		{"extra arg not a flag", []string{"--set", "extraArgs={workers=32}"},
			[]string{"/extraArgs/0", "does not match pattern"}},
		{"kopf migration not a boolean", []string{"--set-string", "kopfMigration.enabled=yes"},
			[]string{"/kopfMigration/enabled", "got string, want boolean"}},
		{"namespace not a DNS label", []string{"--set", "namespace.name=Team_A"},
			[]string{"/namespace/name", "does not match pattern"}},
		{"watched namespace not a DNS label", []string{"--set", "watchNamespaces={team-a,Team_B}"},
			[]string{"/watchNamespaces/1", "does not match pattern"}},
		{"watched namespace twice", []string{"--set", "watchNamespaces={team-a,team-a}"},
			[]string{"/watchNamespaces", "items at 0 and 1 are equal"}},
		{"--namespace behind watchNamespaces' back", []string{"--set", "extraArgs={--namespace=team-a}"},
			[]string{"/extraArgs/0", "'not' failed"}},
		{"spread constraint without topologyKey", []string{"--set", "topologySpreadConstraints[0].maxSkew=1", "--set", "topologySpreadConstraints[0].whenUnsatisfiable=DoNotSchedule"},
			[]string{"/topologySpreadConstraints/0", "missing property 'topologyKey'"}},
		{"metrics namespace not a DNS label", []string{"--set", "networkPolicy.metricsNamespace=Monitoring"},
			[]string{"/networkPolicy/metricsNamespace", "does not match pattern"}},
		{"scrape interval not a duration", []string{"--set-string", "monitoring.interval=30"},
			[]string{"/monitoring/interval", "does not match pattern"}},
		{"monitoring over plain HTTP", []string{"--set", "monitoring.enabled=true", "--set", "metrics.secure=false"},
			[]string{"monitoring.enabled needs metrics.secure: true"}},
		{"two replicas without leader election", []string{"--set", "leaderElection.enabled=false"},
			[]string{"replicas: 2 needs leaderElection.enabled: true"}},
		// Anything the schema accepts renders a Pod that passes the
		// restricted Pod Security Standard: each way out is refused.
		{"pod may run as root", []string{"--set", "podSecurityContext.runAsNonRoot=false"},
			[]string{"/podSecurityContext/runAsNonRoot"}},
		{"pod as uid 0", []string{"--set", "podSecurityContext.runAsUser=0"},
			[]string{"/podSecurityContext/runAsUser"}},
		{"pod seccomp unconfined", []string{"--set", "podSecurityContext.seccompProfile.type=Unconfined"},
			[]string{"/podSecurityContext/seccompProfile/type"}},
		{"pod security context dropped", []string{"--set", "podSecurityContext=null"},
			[]string{"podSecurityContext"}},
		{"pod sysctls", []string{"--set", "podSecurityContext.sysctls[0].name=net.ipv4.ip_forward", "--set-string", "podSecurityContext.sysctls[0].value=1"},
			[]string{"/podSecurityContext", "sysctls"}},
		{"privilege escalation", []string{"--set", "securityContext.allowPrivilegeEscalation=true"},
			[]string{"/securityContext/allowPrivilegeEscalation"}},
		{"privileged", []string{"--set", "securityContext.privileged=true"},
			[]string{"/securityContext/privileged"}},
		{"a capability added", []string{"--set", "securityContext.capabilities.add={SYS_ADMIN}"},
			[]string{"/securityContext/capabilities/add/0"}},
		{"capabilities not all dropped", []string{"--set", "securityContext.capabilities.drop={NET_RAW}"},
			[]string{"/securityContext/capabilities/drop"}},
		{"container seccomp unconfined", []string{"--set", "securityContext.seccompProfile.type=Unconfined"},
			[]string{"/securityContext/seccompProfile/type"}},
		{"container as root", []string{"--set", "securityContext.runAsUser=0"},
			[]string{"/securityContext/runAsUser"}},
		{"container security context dropped", []string{"--set", "securityContext=null"},
			[]string{"securityContext"}},
		// extraArgs cannot undo metrics.secure, nor move the Lease off
		// the one the Role grants.
		{"extra arg turns metrics auth off", []string{"--set", "extraArgs={--metrics-secure=false}"},
			[]string{"/extraArgs/0"}},
		{"extra arg turns metrics auth off, one dash", []string{"--set", "extraArgs={-metrics-secure=false}"},
			[]string{"/extraArgs/0"}},
		{"extra arg lowers TLS", []string{"--set", "extraArgs={--metrics-tls-min-version=1.2}"},
			[]string{"/extraArgs/0"}},
		{"extra arg renames the Lease", []string{"--set", "extraArgs={--leader-elect-name=other}"},
			[]string{"/extraArgs/0"}},
		// Nor turn off what the chart's own checks and objects rely on.
		{"extra arg turns leader election off", []string{"--set", "extraArgs={--leader-elect=false}"},
			[]string{"/extraArgs/0", "'not' failed"}},
		{"extra arg moves the health port off the probes", []string{"--set", "extraArgs={--health-addr=:8081}"},
			[]string{"/extraArgs/0", "'not' failed"}},
		{"extra arg moves the metrics port off the Service", []string{"--set", "extraArgs={--metrics-addr=:9443}"},
			[]string{"/extraArgs/0", "'not' failed"}},
		{"extra arg removes kopf's finalizer without its grant", []string{"--set", "extraArgs={--remove-kopf-finalizer}"},
			[]string{"/extraArgs/0", "'not' failed"}},
		{"namespace created with no name", []string{"--set", "namespace.name="},
			[]string{"namespace.create: true needs namespace.name"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, errOut, err := run(t, "helm", append([]string{"template", "uuid-controller", chartDir}, tt.set...)...)
			if err == nil {
				t.Fatalf("helm template %v succeeded, want an error", tt.set)
			}
			for _, w := range tt.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("helm template %v: error does not say %q:\n%s", tt.set, w, errOut)
				}
			}
		})
	}
}
