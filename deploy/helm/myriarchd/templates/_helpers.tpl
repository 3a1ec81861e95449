{{- define "myriarchd.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "myriarchd.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "myriarchd.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Seconds of a Go duration string with one unit: 30s, 2m, 1h. */}}
{{- define "myriarchd.seconds" -}}
{{- $d := toString . -}}
{{- if hasSuffix "ms" $d -}}{{ div (trimSuffix "ms" $d | atoi) 1000 }}
{{- else if hasSuffix "s" $d -}}{{ trimSuffix "s" $d | atoi }}
{{- else if hasSuffix "m" $d -}}{{ mul (trimSuffix "m" $d | atoi) 60 }}
{{- else if hasSuffix "h" $d -}}{{ mul (trimSuffix "h" $d | atoi) 3600 }}
{{- else -}}{{ fail (printf "duration %q: use one unit (s, m or h), or set terminationGracePeriodSeconds and prometheusRule.noLeaderFor explicitly" $d) }}
{{- end -}}
{{- end -}}

{{/* preStopSleepSeconds + 2 * server.shutdownTimeout + 15 (final flush) + 5 (leader release, pool close). */}}
{{- define "myriarchd.gracePeriod" -}}
{{- if .Values.terminationGracePeriodSeconds -}}{{ .Values.terminationGracePeriodSeconds }}
{{- else -}}
{{- $shutdown := include "myriarchd.seconds" (.Values.config.server.shutdownTimeout | default "30s") | atoi -}}
{{- add .Values.preStopSleepSeconds (mul 2 $shutdown) 15 5 -}}
{{- end -}}
{{- end -}}

{{- define "myriarchd.secretName" -}}
{{- .Values.secret.existingSecret | default (printf "%s-secret" (include "myriarchd.fullname" .)) -}}
{{- end -}}
