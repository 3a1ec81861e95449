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

{{/*
Seconds (a decimal number) of a Go duration string as myriarchd reads it:
30s, 1m30s, 1500ms, 2.5m. Sub-second units divide by an integer, so that
1500ms is exactly 1.5.
*/}}
{{- define "myriarchd.seconds" -}}
{{- $d := toString . -}}
{{- $part := "([0-9]*[.])?[0-9]+(ns|us|µs|ms|s|m|h)" -}}
{{- if not (regexMatch (printf "^(%s)+$" $part) $d) -}}
{{- fail (printf "duration %q: must be a Go duration such as 30s, 1m30s or 1500ms" $d) -}}
{{- end -}}
{{- $mul := dict "ns" 1 "us" 1 "µs" 1 "ms" 1 "s" 1 "m" 60 "h" 3600 -}}
{{- $div := dict "ns" 1000000000 "us" 1000000 "µs" 1000000 "ms" 1000 "s" 1 "m" 1 "h" 1 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll $part $d -1 -}}
{{- $num := regexFind "^([0-9]*[.])?[0-9]+" . -}}
{{- $unit := trimPrefix $num . -}}
{{- $total = addf $total (divf (mulf (float64 $num) (get $mul $unit)) (get $div $unit)) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/*
terminationGracePeriodSeconds: preStopSleepSeconds + 2 * server.shutdownTimeout
+ 15 (final flush) + 5 (leader release, pool close), rounded up to whole
seconds (failover.TerminationGracePeriod; a test keeps them equal).
*/}}
{{- define "myriarchd.gracePeriod" -}}
{{- if .Values.terminationGracePeriodSeconds -}}{{ .Values.terminationGracePeriodSeconds }}
{{- else -}}
{{- $shutdown := include "myriarchd.seconds" (.Values.config.server.shutdownTimeout | default "30s") | float64 -}}
{{- addf .Values.preStopSleepSeconds (mulf 2 $shutdown) 15 5 | ceil | int -}}
{{- end -}}
{{- end -}}

{{/*
"for" of the no-leader alert: the failover bound after a hard failure,
ha.leaderSessionTimeout, in whole seconds (rounded up), a duration that
Prometheus accepts whatever form the config uses.
*/}}
{{- define "myriarchd.noLeaderFor" -}}
{{- if .Values.prometheusRule.noLeaderFor -}}{{ .Values.prometheusRule.noLeaderFor }}
{{- else -}}
{{- include "myriarchd.seconds" (.Values.config.ha.leaderSessionTimeout | default "30s") | float64 | ceil | int -}}s
{{- end -}}
{{- end -}}

{{- define "myriarchd.secretName" -}}
{{- .Values.secret.existingSecret | default (printf "%s-secret" (include "myriarchd.fullname" .)) -}}
{{- end -}}
