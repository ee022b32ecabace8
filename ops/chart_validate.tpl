{{- /* Copied by `python -m ops.chart` from ops/chart_validate.tpl: do not edit here. */}}
{{- /* What values.schema.json cannot say: relations between values. */}}
{{- $overlays := list }}
{{- if .Values.events.enabled }}{{ $overlays = append $overlays "events.enabled=true" }}{{ end }}
{{- if ne .Values.mtls.mode "off" }}{{ $overlays = append $overlays (printf "mtls.mode=%s" .Values.mtls.mode) }}{{ end }}
{{- if .Values.sharding.enabled }}{{ $overlays = append $overlays "sharding.enabled=true" }}{{ end }}
{{- if gt (len $overlays) 1 }}
{{- fail (printf "pg-failover-hook: %s: choose at most one of events.enabled, mtls.mode (not off) and sharding.enabled, as deploy/ offers one overlay at a time" (join ", " $overlays)) }}
{{- end }}
{{- if gt (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas) }}
{{- fail (printf "pg-failover-hook: autoscaling.minReplicas (%d) is greater than autoscaling.maxReplicas (%d)" (int .Values.autoscaling.minReplicas) (int .Values.autoscaling.maxReplicas)) }}
{{- end }}
