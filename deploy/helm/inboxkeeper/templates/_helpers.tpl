{{/* Names and labels. */}}
{{- define "inboxkeeper.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "inboxkeeper.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains (include "inboxkeeper.name" .) .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name (include "inboxkeeper.name" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "inboxkeeper.selectorLabels" -}}
app.kubernetes.io/name: {{ include "inboxkeeper.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "inboxkeeper.labels" -}}
{{ include "inboxkeeper.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "inboxkeeper.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{- define "inboxkeeper.mode" -}}
{{- if not (has .Values.mode (list "deployment" "cronjob" "sidecar")) -}}
{{- fail (printf "mode %q: want deployment, cronjob or sidecar" .Values.mode) -}}
{{- end -}}
{{- .Values.mode -}}
{{- end -}}

{{/*
A Job's podFailurePolicy: exit status 2 (a configuration error, nothing
touched) fails the Job at once instead of being retried. Kubernetes has it
from 1.26 (beta, on by default; GA in 1.31); older ones retry up to
backoffLimit. Argument: root, and whether to ignore disruptions.
*/}}
{{- define "inboxkeeper.podFailurePolicy" -}}
{{- if semverCompare ">=1.26.0-0" .root.Capabilities.KubeVersion.Version }}
podFailurePolicy:
  rules:
    - action: FailJob
      onExitCodes:
        containerName: inboxkeeper
        operator: In
        values: [2]
    {{- if .disruptions }}
    - action: Ignore
      onPodConditions:
        - type: DisruptionTarget
    {{- end }}
{{- end }}
{{- end -}}

{{/* The ConfigMap that holds the policy file. */}}
{{- define "inboxkeeper.policyConfigMap" -}}
{{- if .Values.policy.existingConfigMap -}}
{{- .Values.policy.existingConfigMap -}}
{{- else if .Values.policy.inline -}}
{{- printf "%s-policy" (include "inboxkeeper.fullname" .) -}}
{{- else -}}
{{- fail "set policy.inline (the policy file) or policy.existingConfigMap: inboxkeeper has no default policy" -}}
{{- end -}}
{{- end -}}

{{- define "inboxkeeper.policyVolume" -}}
- name: policy
  configMap:
    name: {{ .configMap }}
    items:
      - key: {{ .root.Values.policy.key }}
        path: inboxkeeper.yaml
{{- end -}}

{{- define "inboxkeeper.policyMount" -}}
- name: policy
  mountPath: /etc/inboxkeeper
  readOnly: true
{{- end -}}

{{/*
The environment of an inboxkeeper container. Arguments: root, command (run,
once, migrate), secret and key of the connection string.
*/}}
{{- define "inboxkeeper.env" -}}
{{- $v := .root.Values -}}
{{- if and $v.database.asFile (ne .command "migrate") }}
- name: INBOXKEEPER_DATABASE_URL_FILE
  value: /etc/inboxkeeper-database/url
{{- else }}
- name: INBOXKEEPER_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .secret }}
      key: {{ .key }}
{{- end }}
- name: INBOXKEEPER_POLICY_FILE
  value: /etc/inboxkeeper/inboxkeeper.yaml
- name: INBOXKEEPER_LOG_FORMAT
  value: json
{{- if eq .command "run" }}
# The kubelet's probes and Prometheus connect to the pod IP.
- name: INBOXKEEPER_METRICS_ADDR
  value: {{ printf "0.0.0.0:%d" (int $v.metrics.port) | quote }}
{{- end }}
{{- if eq .command "once" }}
- name: INBOXKEEPER_RUN_TIME
  value: {{ $v.cronjob.runTime | quote }}
{{- end }}
{{- if $v.goMemLimit }}
- name: GOMEMLIMIT
  value: {{ $v.goMemLimit | quote }}
{{- end }}
{{- if ne .command "migrate" }}
{{- range $name, $value := $v.env }}
{{- if has $name (list "INBOXKEEPER_DATABASE_URL" "INBOXKEEPER_DATABASE_URL_FILE" "INBOXKEEPER_POLICY_FILE" "INBOXKEEPER_METRICS_ADDR") }}
{{- fail (printf "env.%s: the chart sets it (database, policy, metrics.port)" $name) }}
{{- end }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- with $v.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
The inboxkeeper container for `run` or `once`. Arguments: root, command,
secret, key. The sidecar's spec (NOTES.txt) is this one too, plus
restartPolicy: Always.
*/}}
{{- define "inboxkeeper.container" -}}
{{- $v := .root.Values -}}
name: inboxkeeper
image: {{ include "inboxkeeper.image" .root }}
imagePullPolicy: {{ $v.image.pullPolicy }}
{{- if and (eq .command "once") $v.cronjob.pushgateway }}
args: [{{ .command | quote }}, "--pushgateway", {{ $v.cronjob.pushgateway | quote }}, "--push-instance", {{ include "inboxkeeper.fullname" .root | quote }}]
{{- else }}
args: [{{ .command | quote }}]
{{- end }}
env:
{{- include "inboxkeeper.env" . | trim | nindent 2 }}
{{- if eq .command "run" }}
ports:
  - name: metrics
    containerPort: {{ $v.metrics.port }}
livenessProbe:
{{- toYaml $v.livenessProbe | nindent 2 }}
readinessProbe:
{{- toYaml $v.readinessProbe | nindent 2 }}
{{- end }}
resources:
{{- toYaml $v.resources | nindent 2 }}
securityContext:
{{- toYaml $v.securityContext | nindent 2 }}
volumeMounts:
{{- include "inboxkeeper.policyMount" . | nindent 2 }}
{{- if and $v.database.asFile (ne .command "migrate") }}
  - name: database-url
    mountPath: /etc/inboxkeeper-database
    readOnly: true
{{- end }}
{{- end -}}

{{- define "inboxkeeper.databaseVolume" -}}
{{- if .Values.database.asFile }}
- name: database-url
  secret:
    secretName: {{ .Values.database.existingSecret }}
    defaultMode: 0400
    items:
      - key: {{ .Values.database.secretKey }}
        path: url
{{- end }}
{{- end -}}

{{/* What every pod of the chart shares. */}}
{{- define "inboxkeeper.podSpec" -}}
# Kubernetes injects variables named after each Service: those of a Service
# named inboxkeeper are ignored, but inboxkeeper-metrics (the chart's, for a
# release named inboxkeeper) injects INBOXKEEPER_METRICS_SERVICE_HOST and the
# like, unknown INBOXKEEPER_* variables that make inboxkeeper exit 2.
enableServiceLinks: false
automountServiceAccountToken: false
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
{{- toYaml .Values.podSecurityContext | nindent 2 }}
terminationGracePeriodSeconds: {{ .Values.terminationGracePeriodSeconds }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Arguments: root, annotations (merged over podAnnotations). */}}
{{- define "inboxkeeper.podMetadata" -}}
{{- $ann := merge (dict) (.annotations | default dict) .root.Values.podAnnotations -}}
labels:
{{- include "inboxkeeper.selectorLabels" .root | nindent 2 }}
{{- with .root.Values.podLabels }}
{{- toYaml . | nindent 2 }}
{{- end }}
{{- with $ann }}
annotations:
{{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
