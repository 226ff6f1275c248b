{{- define "sked.name" -}}sked{{- end -}}

{{- define "sked.workloadNamespace" -}}
{{- default .Release.Namespace .Values.workloadNamespace -}}
{{- end -}}

{{- define "sked.labels" -}}
app.kubernetes.io/name: sked
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "sked.selectorLabels" -}}
app.kubernetes.io/name: sked
app.kubernetes.io/instance: {{ .Release.Name }}
control-plane: controller-manager
{{- end -}}

{{- define "sked.controllerImage" -}}
{{ .Values.controller.image.repository }}:{{ default .Chart.AppVersion .Values.controller.image.tag }}
{{- end -}}

{{- define "sked.agentImage" -}}
{{ .Values.agent.image.repository }}:{{ default .Chart.AppVersion .Values.agent.image.tag }}
{{- end -}}

{{- define "sked.reportsSecret" -}}
{{- if eq .Values.reports.tls.mode "existingSecret" -}}
{{ required "reports.tls.existingSecret is required when reports.tls.mode=existingSecret" .Values.reports.tls.existingSecret }}
{{- else -}}
sked-reports-tls
{{- end -}}
{{- end -}}

{{- define "sked.webhookSecret" -}}
{{- if eq .Values.webhook.tls.mode "existingSecret" -}}
{{ required "webhook.tls.existingSecret is required when webhook.tls.mode=existingSecret" .Values.webhook.tls.existingSecret }}
{{- else -}}
sked-webhook-tls
{{- end -}}
{{- end -}}

{{- /*
The issuer of a serving certificate (certManager mode): the one named for it; for the webhook,
else the one named for the reports server; else the chart's own CA (templates/ca.yaml).
*/ -}}
{{- define "sked.reportsIssuer" -}}
{{- $r := .Values.reports.tls.issuerRef -}}
{{- if $r.name -}}
{name: {{ $r.name }}, kind: {{ $r.kind }}}
{{- else -}}
{name: sked-ca, kind: Issuer}
{{- end -}}
{{- end -}}

{{- define "sked.webhookIssuer" -}}
{{- $w := .Values.webhook.tls.issuerRef -}}
{{- if $w.name -}}
{name: {{ $w.name }}, kind: {{ $w.kind }}}
{{- else -}}
{{ include "sked.reportsIssuer" . }}
{{- end -}}
{{- end -}}

{{- /* "true" when a certificate is to be signed by the chart's own CA. */ -}}
{{- define "sked.ownCA" -}}
{{- $r := .Values.reports.tls -}}
{{- $w := .Values.webhook.tls -}}
{{- if or (and (eq $r.mode "certManager") (not $r.issuerRef.name)) (and (eq $w.mode "certManager") (not $w.issuerRef.name) (not $r.issuerRef.name)) -}}
true
{{- end -}}
{{- end -}}
