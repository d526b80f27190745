{{/*
The objects' name. Fixed, as in deploy/: the controller's Lease, its
ServiceAccount (named in the admission policy) and the ClusterRoles are
cluster-wide facts, and one controller per cluster serves the CRD.
*/}}
{{- define "uuid-controller.name" -}}
uuid-controller
{{- end }}

{{/* The namespace of the controller's objects. */}}
{{- define "uuid-controller.namespace" -}}
{{- .Values.namespace.name | default .Release.Namespace }}
{{- end }}

{{/* The selector: deploy/'s, so a kustomize install can be taken over. */}}
{{- define "uuid-controller.selectorLabels" -}}
app.kubernetes.io/name: {{ include "uuid-controller.name" . }}
{{- end }}

{{/*
Helm's labels, on every object beside deploy/'s; test/chart strips exactly
these when it compares the chart with the kustomization.
*/}}
{{- define "uuid-controller.helmLabels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{- define "uuid-controller.labels" -}}
{{ include "uuid-controller.selectorLabels" . }}
{{ include "uuid-controller.helmLabels" . }}
{{- end }}

{{/* repository[:tag][@digest]; the tag defaults to the appVersion when no digest is set. */}}
{{- define "uuid-controller.image" -}}
{{- $tag := .Values.image.tag | default (ternary "" .Chart.AppVersion (ne .Values.image.digest "")) -}}
{{- .Values.image.repository }}{{ if $tag }}:{{ $tag }}{{ end }}{{ if .Values.image.digest }}@{{ .Values.image.digest }}{{ end }}
{{- end }}

{{/* Checks across values that the schema cannot word clearly. */}}
{{- define "uuid-controller.validate" -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) }}
{{- fail (printf "replicas: %d needs leaderElection.enabled: true (without it every replica writes)" (int .Values.replicas)) }}
{{- end }}
{{- if eq (int .Values.metrics.port) 8080 }}
{{- fail "metrics.port: 8080 is the health port (/healthz, /readyz); choose another" }}
{{- end }}
{{- if and .Values.monitoring.enabled (not .Values.metrics.secure) }}
{{- fail "monitoring.enabled needs metrics.secure: true (the ServiceMonitor scrapes HTTPS with a token)" }}
{{- end }}
{{- if and (not .Values.namespace.name) (not .Release.Namespace) }}
{{- fail "namespace.name is empty and the release has no namespace" }}
{{- end }}
{{- if and .Values.namespace.create (not .Values.namespace.name) }}
{{- fail "namespace.create: true needs namespace.name: the release's namespace exists already (Helm keeps the release in it), so install into it with --set namespace.create=false" }}
{{- end }}
{{- end }}
