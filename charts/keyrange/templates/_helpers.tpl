{{/* Chart name, overridable. */}}
{{- define "keyrange.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: <release>-keyrange unless the release name already contains it. */}}
{{- define "keyrange.fullname" -}}
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

{{/* chart label value */}}
{{- define "keyrange.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels: stable for the release's lifetime (selectors are immutable). */}}
{{- define "keyrange.selectorLabels" -}}
app.kubernetes.io/name: {{ include "keyrange.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* Labels on every object of the chart. */}}
{{- define "keyrange.labels" -}}
helm.sh/chart: {{ include "keyrange.chart" . }}
{{ include "keyrange.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: keyrange
{{- end -}}

{{/* The operator's ServiceAccount name. */}}
{{- define "keyrange.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "keyrange.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The image reference (tag defaults to the chart's appVersion). */}}
{{- define "keyrange.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* The Secret holding the webhook bearer token. */}}
{{- define "keyrange.webhookSecretName" -}}
{{- default (printf "%s-webhook" (include "keyrange.fullname" .)) .Values.webhook.existingSecret -}}
{{- end -}}

{{/* The Lease the operator replicas elect their leader with (one per release). */}}
{{- define "keyrange.leaseName" -}}
{{- include "keyrange.fullname" . -}}
{{- end -}}

{{/* The ClusterRole Spark drivers are bound to (by RoleBindings the operator creates per consumer). */}}
{{- define "keyrange.sparkDriverRole" -}}
{{- printf "%s-spark-driver" (include "keyrange.fullname" .) -}}
{{- end -}}

{{/* Rules the operator needs on StreamConsumers' namespaces (least privilege, see docs/kubernetes.md). */}}
{{- define "keyrange.namespacedRules" -}}
- apiGroups: [keyrange.dev]
  resources: [streamconsumers]
  verbs: [get, list, watch, patch]
- apiGroups: [keyrange.dev]
  resources: [streamconsumers/status]
  verbs: [get, patch]
# Children carry ownerReferences with blockOwnerDeletion: true; clusters enforcing
# OwnerReferencesPermissionEnforcement (OpenShift, for one) require update on the owner's finalizers.
- apiGroups: [keyrange.dev]
  resources: [streamconsumers/finalizers]
  verbs: [update]
- apiGroups: [apps]
  resources: [statefulsets]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [services, configmaps, serviceaccounts]
  verbs: [get, create, patch]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
- apiGroups: [events.k8s.io]
  resources: [events]
  verbs: [create]
- apiGroups: [monitoring.coreos.com]
  resources: [servicemonitors, prometheusrules]
  verbs: [get, create, patch]
{{- if .Values.workers.podDisruptionBudget.enabled }}
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, create, patch]
{{- end }}
{{- if .Values.networkPolicy.enabled }}
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [get, create, patch]
{{- end }}
{{- if .Values.rbac.sparkAggregation }}
# Spark aggregation (spec.aggregation): the driver's objects, deleted again when aggregation is
# turned off or its mode changes. No pod rights: the driver's ServiceAccount gets them through a
# RoleBinding to the drivers' ClusterRole, which the operator may bind (and nothing else).
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, create, patch, delete]
- apiGroups: [batch]
  resources: [cronjobs]
  verbs: [get, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [rolebindings]
  verbs: [get, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [clusterroles]
  verbs: [bind]
  resourceNames: [{{ include "keyrange.sparkDriverRole" . }}]
- apiGroups: [sparkoperator.k8s.io]
  resources: [sparkapplications, scheduledsparkapplications]
  verbs: [get, create, patch, delete]
- apiGroups: [""]
  resources: [serviceaccounts, services]
  verbs: [delete]
- apiGroups: [""]
  resources: [persistentvolumeclaims]
  verbs: [get, create, patch]
{{- end }}
{{- end -}}

{{/* The alerts' runbook: the value, else docs/autoscaling.md of this release on GitHub. */}}
{{- define "keyrange.runbookUrl" -}}
{{- $url := ((.Values.autoscaling | default dict).prometheusRule | default dict).runbookUrl -}}
{{- default (printf "https://github.com/keyrange/keyrange/blob/v%s/docs/autoscaling.md" .Chart.AppVersion) $url -}}
{{- end -}}

{{/* A NetworkPolicy peer that selects the operator's pods. */}}
{{- define "keyrange.operatorPeer" -}}
namespaceSelector:
  matchLabels:
    kubernetes.io/metadata.name: {{ .Release.Namespace }}
podSelector:
  matchLabels:
    {{- include "keyrange.selectorLabels" . | nindent 4 }}
{{- end -}}

{{/* What every worker pod gets unless its StreamConsumer says otherwise (the operator's
     --worker-defaults file; src/keyrange/operator/workerdefaults.py reads it). */}}
{{- define "keyrange.workerDefaults" -}}
{{- $w := .Values.workers -}}
{{- $np := .Values.networkPolicy -}}
{{- $network := dict "enabled" $np.enabled "metricsFrom" $np.prometheus "operator" (list (include "keyrange.operatorPeer" . | fromYaml)) "kafka" $np.kafka -}}
{{- $defaults := dict "resources" $w.resources "nodeSelector" $w.nodeSelector "affinity" $w.affinity "tolerations" $w.tolerations "topologySpreadConstraints" $w.topologySpreadConstraints "imagePullSecrets" .Values.imagePullSecrets "podDisruptionBudget" $w.podDisruptionBudget "networkPolicy" $network -}}
{{- if $w.priorityClassName -}}
{{- $_ := set $defaults "priorityClassName" $w.priorityClassName -}}
{{- end -}}
{{- toYaml $defaults -}}
{{- end -}}

{{/* Whether to install the Grafana dashboard ConfigMap (null: with monitoring.serviceMonitor). */}}
{{- define "keyrange.grafanaDashboard" -}}
{{- $d := .Values.monitoring.grafanaDashboard -}}
{{- if kindIs "invalid" $d.enabled -}}
{{- if .Values.monitoring.serviceMonitor }}true{{ end -}}
{{- else if $d.enabled -}}
true
{{- end -}}
{{- end -}}
