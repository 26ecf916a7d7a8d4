{{/* Common labels of every object of the chart. */}}
{{- define "dowse.labels" -}}
app.kubernetes.io/part-of: dowse
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | quote }}
{{- end -}}

{{/*
An image reference: dowse.image (dict "root" $ "name" "dowse-agent" "image" .Values.agent.image).
*/}}
{{- define "dowse.image" -}}
{{- $repo := .image.repository | default (printf "%s/%s" .root.Values.image.registry .name) -}}
{{- $tag := .image.tag | default .root.Values.image.tag | default .root.Chart.AppVersion -}}
{{- printf "%s:%s" $repo $tag -}}
{{- end -}}

{{/* Pod-level scheduling fields: dowse.scheduling (dict "root" $ "part" .Values.agent). */}}
{{- define "dowse.scheduling" -}}
{{- with (.part.nodeSelector | default .root.Values.nodeSelector) }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (.part.tolerations | default .root.Values.tolerations) }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (.part.affinity | default .root.Values.affinity) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (.part.priorityClassName | default .root.Values.priorityClassName) }}
priorityClassName: {{ . }}
{{- end }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Pod template metadata: dowse.podMeta (dict "root" $ "name" "dowse-agent"). */}}
{{- define "dowse.podMeta" -}}
labels:
  app.kubernetes.io/name: {{ .name }}
  app.kubernetes.io/part-of: dowse
  app.kubernetes.io/instance: {{ .root.Release.Name }}
  {{- with .root.Values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .root.Values.podAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Selector labels of a part. */}}
{{- define "dowse.selector" -}}
app.kubernetes.io/name: {{ .name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- end -}}

{{/* The link's first host: the name agents dial. */}}
{{- define "dowse.linkHost" -}}
{{- if .Values.link.hosts -}}
{{- first .Values.link.hosts -}}
{{- else -}}
{{- printf "dowse-cloudhub.%s.svc" .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* The link's hosts in the controller's serving certificate. */}}
{{- define "dowse.linkHosts" -}}
{{- if .Values.link.hosts -}}
{{- join "," .Values.link.hosts -}}
{{- else -}}
{{- printf "dowse-cloudhub.%s.svc,dowse-cloudhub.%s.svc.cluster.local" .Release.Namespace .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* Whether the chart hands agents the link CA's certificate (else a pin). */}}
{{- define "dowse.linkCAFromConfigMap" -}}
{{- if and .Values.link.enabled (or .Values.link.ca.cert (and .Values.link.ca.generate (not .Values.link.caCertHash))) -}}true{{- end -}}
{{- end -}}

{{/* The agent's resources: agent.resources, with a memory limit sized for
agent.maxDevices devices (48Mi + 56Ki each, at least 128Mi) unless one is
given. */}}
{{- define "dowse.agentResources" -}}
{{- $r := deepCopy (.Values.agent.resources | default dict) -}}
{{- $limits := $r.limits | default dict -}}
{{- if not $limits.memory -}}
{{- $mi := add 48 (div (add (mul (int .Values.agent.maxDevices) 56) 1023) 1024) -}}
{{- $_ := set $limits "memory" (printf "%dMi" (max 128 $mi)) -}}
{{- end -}}
{{- $_ := set $r "limits" $limits -}}
{{- toYaml $r -}}
{{- end -}}

{{/* What the controller must hold to grant the agents read of the Secrets
and ConfigMaps discoveryProperties name (RBAC's escalation check): as
ClusterRole rules, or as a Role's in each namespace rbac.configurationNamespaces
and rbac.propertyNamespaces name. */}}
{{- define "dowse.controllerPropertyRules" }}
  - apiGroups: [""]
    resources: ["secrets", "configmaps"]
    verbs: ["get", "list", "watch"]
  - apiGroups: ["rbac.authorization.k8s.io"]
    resources: ["roles", "rolebindings"]
    verbs: ["create"]
  - apiGroups: ["rbac.authorization.k8s.io"]
    resources: ["roles", "rolebindings"]
    resourceNames: ["dowse-agent-discovery-properties"]
    verbs: ["patch", "delete"]
{{- end }}

{{/* The names and addresses the API server may dial for the egress: the
Service's DNS names, its fixed address when set, and link.egress.hosts. */}}
{{- define "dowse.egressHosts" -}}
{{- $hosts := list (printf "dowse-egress.%s.svc" .Release.Namespace) (printf "dowse-egress.%s.svc.cluster.local" .Release.Namespace) -}}
{{- with .Values.link.egress.service.clusterIP }}{{ $hosts = append $hosts . }}{{ end -}}
{{- join "," (concat $hosts .Values.link.egress.hosts | uniq) -}}
{{- end }}
