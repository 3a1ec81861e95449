{{- define "myriarch-bridge.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}{{ .Release.Name | trunc 63 | trimSuffix "-" }}{{- else -}}{{ printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" }}{{- end -}}
{{- end -}}

{{- define "myriarch-bridge.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "myriarch-bridge.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
Seconds (a decimal number) of a Go duration string as the bridge reads it:
30s, 1m30s, 1500ms, 2.5m.
*/}}
{{- define "myriarch-bridge.seconds" -}}
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
terminationGracePeriodSeconds: bridge.shutdown_timeout + 5 (lease release)
+ 5 (HTTP server), rounded up (stopbound.Stop; a test keeps them equal).
*/}}
{{- define "myriarch-bridge.gracePeriod" -}}
{{- if .Values.terminationGracePeriodSeconds -}}{{ .Values.terminationGracePeriodSeconds }}
{{- else -}}
{{- $bridge := .Values.config.bridge | default dict -}}
{{- $shutdown := include "myriarch-bridge.seconds" ($bridge.shutdown_timeout | default "30s") | float64 -}}
{{- addf $shutdown 5 5 | ceil | int -}}
{{- end -}}
{{- end -}}

{{/*
Failover objective of the alerts, in whole seconds: prometheusRule.failoverSLO
or the largest failover_slo of config.routes (600 when no route declares one).
*/}}
{{- define "myriarch-bridge.sloSeconds" -}}
{{- if .Values.prometheusRule.failoverSLO -}}
{{- include "myriarch-bridge.seconds" .Values.prometheusRule.failoverSLO | float64 | ceil | int -}}
{{- else -}}
{{- $max := 0.0 -}}
{{- range .Values.config.routes -}}
{{- if .failover_slo -}}{{- $max = maxf $max (include "myriarch-bridge.seconds" .failover_slo | float64) -}}{{- end -}}
{{- end -}}
{{- if eq $max 0.0 }}600{{ else }}{{ $max | ceil | int }}{{ end -}}
{{- end -}}
{{- end -}}

{{- define "myriarch-bridge.budget" -}}
{{- if .Values.prometheusRule.budget -}}
{{- include "myriarch-bridge.seconds" .Values.prometheusRule.budget | float64 | ceil | int -}}s
{{- else -}}
{{- include "myriarch-bridge.sloSeconds" . -}}s
{{- end -}}
{{- end -}}

{{- define "myriarch-bridge.secretName" -}}
{{- .Values.secret.existingSecret | default (printf "%s-secret" (include "myriarch-bridge.fullname" .)) -}}
{{- end -}}

{{/* The configuration with the keys the chart owns. */}}
{{- define "myriarch-bridge.config" -}}
{{- $cfg := deepCopy .Values.config -}}
{{- $bridge := get $cfg "bridge" | default dict -}}
{{- $_ := set $bridge "http" (dict "listen" (printf ":%v" .Values.httpPort)) -}}
{{- $_ := set $bridge "state_dir" "/var/lib/myriarch-bridge" -}}
{{- $_ := set $bridge "dead_letter" (dict "path" "/var/lib/myriarch-bridge/dead-letter.jsonl") -}}
{{- $_ := set $cfg "bridge" $bridge -}}
{{- toYaml $cfg -}}
{{- end -}}
