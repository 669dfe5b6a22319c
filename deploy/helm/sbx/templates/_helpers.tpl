{{/* Object names: the release name, with -sbx unless it already says sbx. */}}
{{- define "sbx.fullname" -}}
{{- if contains "sbx" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-sbx" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "sbx.labels" -}}
app.kubernetes.io/name: sbx
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "sbx.selector" -}}
app.kubernetes.io/name: sbx
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "sbx.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "sbx.adminTokenSecret" -}}
{{- .Values.adminToken.existingSecret | default (printf "%s-admin-token" (include "sbx.fullname" .)) -}}
{{- end -}}

{{- define "sbx.databaseSecret" -}}
{{- .Values.database.existingSecret | default (printf "%s-database" (include "sbx.fullname" .)) -}}
{{- end -}}

{{/* Pod annotations: Prometheus scraping, and the config's hash so a config change rolls pods. */}}
{{- define "sbx.podAnnotations" -}}
checksum/config: {{ .Values.config | sha256sum }}
{{- if .Values.metrics.annotations }}
prometheus.io/scrape: "true"
prometheus.io/path: /metrics
prometheus.io/port: {{ .Values.service.port | quote }}
{{- end }}
{{- with .Values.podAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Environment both tiers share: the admin token from its Secret. */}}
{{- define "sbx.adminTokenEnv" -}}
- name: SBX_SERVER_ADMIN_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "sbx.adminTokenSecret" . }}
      key: {{ .Values.adminToken.key }}
{{- end -}}

{{/* The shared store's URL from the database Secret: both tiers meet there (docs/scale.md). */}}
{{- define "sbx.storeUrlEnv" -}}
- name: SBX_STORE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "sbx.databaseSecret" . }}
      key: {{ .Values.database.key }}
{{- end -}}

{{- define "sbx.probes" -}}
readinessProbe:
  httpGet:
    path: /readyz
    port: http
  periodSeconds: 5
  failureThreshold: 3
livenessProbe:
  httpGet:
    path: /healthz
    port: http
  initialDelaySeconds: 10
  periodSeconds: 10
  failureThreshold: 6
{{- end -}}

{{/* The node tier's host mounts, shared by sbxd and its doctor. Bidirectional: the sandboxes'
disks and root file systems that sbxd mounts under the state dir must be the host's mounts, so
that a restarted sbxd finds (re-adopts or cleans up) them. */}}
{{- define "sbx.nodeMounts" -}}
- name: state
  mountPath: {{ .Values.node.stateDir }}
  mountPropagation: Bidirectional
- name: cgroup
  mountPath: /sys/fs/cgroup
{{- if .Values.node.kvm.enabled }}
- name: kvm
  mountPath: /dev/kvm
{{- end }}
{{- end -}}
