{{/* The chart's name, or nameOverride. */}}
{{- define "raftlog-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's full name: <release>-<chart>, or the release's name when it holds the chart's. */}}
{{- define "raftlog-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The metrics Service's name: a Service name is at most 63 characters, suffix included. */}}
{{- define "raftlog-operator.metricsService" -}}
{{- printf "%s-metrics" (include "raftlog-operator.fullname" . | trunc 55 | trimSuffix "-") -}}
{{- end -}}

{{- define "raftlog-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "raftlog-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "raftlog-operator.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "raftlog-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: raftlog
{{- end -}}

{{- define "raftlog-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "raftlog-operator.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* repository:tag, or repository@digest when a digest is given. */}}
{{- define "raftlog-operator.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/* "true" when the replicas run in kopf peering (HA, or asked for), else "". */}}
{{- define "raftlog-operator.peering" -}}
{{- if or .Values.peering.enabled (gt (int .Values.replicaCount) 1) -}}true{{- end -}}
{{- end -}}

{{/* The namespaces a namespaced operator watches, as a JSON list. */}}
{{- define "raftlog-operator.watchedNamespaces" -}}
{{- default (list .Release.Namespace) .Values.watch.namespaces | toJson -}}
{{- end -}}

{{/* The namespaces where RaftCluster members get a NetworkPolicy, as a JSON list. */}}
{{- define "raftlog-operator.memberNamespaces" -}}
{{- if eq .Values.watch.mode "cluster" -}}
{{- default (list .Release.Namespace) .Values.networkPolicy.namespaces | toJson -}}
{{- else -}}
{{- include "raftlog-operator.watchedNamespaces" . -}}
{{- end -}}
{{- end -}}

{{/*
What the operator does in a namespace where RaftClusters live. Derived from the operator's code
and checked against its API traffic in the real cluster's audit log (tests/k8s/test_rbac.py):
add nothing here that the operator does not call.
*/}}
{{- define "raftlog-operator.namespacedRules" -}}
# kopf: watches RaftClusters, patches them (finalizer, its own progress) and their status; the
# operator reads one again when its status write meets a newer resourceVersion (409).
- apiGroups: ["raftlog.dev"]
  resources: ["raftclusters"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["raftlog.dev"]
  resources: ["raftclusters/status"]
  verbs: ["patch"]
# Owner references with blockOwnerDeletion (kopf.adopt): needed where the
# OwnerReferencesPermissionEnforcement admission plugin runs.
- apiGroups: ["raftlog.dev"]
  resources: ["raftclusters/finalizers"]
  verbs: ["update"]
# Members: a Pod and a PVC each, observed by label, created and removed one by one.
- apiGroups: [""]
  resources: ["pods", "persistentvolumeclaims"]
  verbs: ["list", "create", "delete"]
# Volume expansion: a raised spec.storage.size is a patch of each member's claim.
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["patch"]
# Per cluster: the headless and client Services and the PDB, server-side applied on every
# pass (an apply that creates the object is also authorized as a create); the auth Secret.
- apiGroups: [""]
  resources: ["services"]
  verbs: ["create", "patch"]
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["create", "patch"]
# kopf posts the reconciler's events on the RaftCluster.
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end -}}
