{{/* Chart name, truncated to the 63-character DNS label limit. */}}
{{- define "changelake.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: release-chart unless the release name already contains the chart name. */}}
{{- define "changelake.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "changelake.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the pipeline's pods. */}}
{{- define "changelake.selectorLabels" -}}
app.kubernetes.io/name: {{ include "changelake.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: pipeline
{{- end }}

{{- define "changelake.labels" -}}
helm.sh/chart: {{ include "changelake.chart" . }}
{{ include "changelake.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
changelake.io/pipeline: {{ include "changelake.pipelineId" . | quote }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "changelake.pipelineId" -}}
{{- ((.Values.pipeline).pipeline).id | default "" -}}
{{- end }}

{{- define "changelake.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "changelake.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* registry/repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "changelake.image" -}}
{{- $img := .Values.image -}}
{{- $tag := default .Chart.AppVersion $img.tag -}}
{{- if $img.registry -}}
{{- printf "%s/%s:%s" $img.registry $img.repository $tag -}}
{{- else -}}
{{- printf "%s:%s" $img.repository $tag -}}
{{- end -}}
{{- end }}

{{- define "changelake.sparkImage" -}}
{{- printf "%s%s" (include "changelake.image" .) .Values.sparkApplication.imageTagSuffix -}}
{{- end }}

{{- define "changelake.configDir" -}}/etc/changelake{{- end }}
{{- define "changelake.sparkConfDir" -}}/etc/changelake/spark{{- end }}

{{/*
The pipeline config as rendered into the ConfigMap:
- metrics.port filled in from metrics.port;
- values that replace the example's pipeline.sources drop the example's tables and views (Helm merges the
  user's pipeline map into values.yaml's example, so they would otherwise stay: a routed source would get
  the example's "products" table without a writer);
- storage.root, when not given, is "<persistence.mountPath>/lake" on the claim (the guards require one
  without a claim).
*/}}
{{- define "changelake.pipelineConfig" -}}
{{- $cfg := deepCopy .Values.pipeline -}}
{{- $example := .Files.Get "files/example-pipeline.yaml" | fromYaml -}}
{{- if ne (toJson $cfg.sources) (toJson $example.sources) -}}
{{- range $section := list "tables" "views" -}}
{{- if and (hasKey $cfg $section) (eq (toJson (get $cfg $section)) (toJson (get $example $section))) -}}
{{- $_ := unset $cfg $section -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $metrics := default dict $cfg.metrics -}}
{{- $_ := set $metrics "port" (default .Values.metrics.port $metrics.port) -}}
{{- $_ := set $cfg "metrics" $metrics -}}
{{- $storage := default dict $cfg.storage -}}
{{- if and (not $storage.root) .Values.persistence.enabled -}}
{{- $_ := set $storage "root" (printf "%s/lake" (trimSuffix "/" .Values.persistence.mountPath)) -}}
{{- $_ := set $cfg "storage" $storage -}}
{{- end -}}
{{- toYaml $cfg -}}
{{- end }}

{{/* Whether a checkpoint location is an object-store URI rather than a local path. */}}
{{- define "changelake.isRemotePath" -}}
{{- if contains "://" . }}true{{ end -}}
{{- end }}

{{/*
Guards for invalid value combinations. Rendered by templates/validate.yaml so
that every install, upgrade and template run checks them.
*/}}
{{- define "changelake.validate" -}}
{{- $v := .Values -}}
{{- if and $v.statefulset.enabled $v.sparkApplication.enabled -}}
{{- fail "statefulset.enabled and sparkApplication.enabled are both true: choose one mode (set statefulset.enabled=false to use the SparkApplication)" -}}
{{- end -}}
{{- if not (or $v.statefulset.enabled $v.sparkApplication.enabled) -}}
{{- fail "neither statefulset.enabled nor sparkApplication.enabled is true: enable exactly one mode" -}}
{{- end -}}
{{- if ne (int $v.statefulset.replicas) 1 -}}
{{- fail (printf "statefulset.replicas is %v: it must be 1, because only one writer may own a checkpoint; run one release per pipeline instead" $v.statefulset.replicas) -}}
{{- end -}}
{{- $p := default dict $v.pipeline -}}
{{- if not (($p.pipeline).id) -}}
{{- fail "pipeline.pipeline.id is required: it names the pipeline and keys its idempotent Delta commits" -}}
{{- end -}}
{{- $checkpoint := (($p.pipeline).checkpoint) | default "" -}}
{{- if not $checkpoint -}}
{{- fail "pipeline.pipeline.checkpoint is required: a PVC path below persistence.mountPath or an object-store URI" -}}
{{- end -}}
{{- $remote := include "changelake.isRemotePath" $checkpoint -}}
{{- if and $v.sparkApplication.enabled (not $remote) -}}
{{- fail (printf "pipeline.pipeline.checkpoint %q is a local path, but sparkApplication mode has no volume for it: use an object-store URI such as s3a://bucket/checkpoints/%s" $checkpoint $p.pipeline.id) -}}
{{- end -}}
{{- if and $v.statefulset.enabled (not $remote) -}}
{{- if not $v.persistence.enabled -}}
{{- fail (printf "persistence.enabled is false but pipeline.pipeline.checkpoint %q is a local path: the checkpoint would be lost on every restart; enable persistence or use an object-store URI" $checkpoint) -}}
{{- end -}}
{{- if not (hasPrefix (printf "%s/" (trimSuffix "/" $v.persistence.mountPath)) $checkpoint) -}}
{{- fail (printf "pipeline.pipeline.checkpoint %q is not below persistence.mountPath %q: the checkpoint must live on the persistent volume" $checkpoint $v.persistence.mountPath) -}}
{{- end -}}
{{- end -}}
{{- if not (or (($p.storage).root) $v.persistence.enabled) -}}
{{- fail "pipeline.storage.root is required without persistence: where tables without a path, and dead letters, live (an object-store URI such as s3a://bucket/lake); with persistence it defaults to <persistence.mountPath>/lake" -}}
{{- end -}}
{{- with (($p.storage).root) -}}
{{- if and $v.persistence.enabled $v.statefulset.enabled (not (include "changelake.isRemotePath" .)) (not (hasPrefix (printf "%s/" (trimSuffix "/" $v.persistence.mountPath)) .)) -}}
{{- fail (printf "pipeline.storage.root %q is a local path not below persistence.mountPath %q: the tables would be lost with the pod; put it on the volume or use an object-store URI" . $v.persistence.mountPath) -}}
{{- end -}}
{{- end -}}
{{- if and $v.sparkApplication.enabled $v.persistence.enabled -}}
{{- fail "persistence.enabled applies to the StatefulSet only: set persistence.enabled=false in sparkApplication mode (its checkpoint is on object storage)" -}}
{{- end -}}
{{- with ($p.metrics).port -}}
{{- if ne (int .) (int $v.metrics.port) -}}
{{- fail (printf "pipeline.metrics.port (%v) differs from metrics.port (%v): probes and scrapes use metrics.port; set one value" . $v.metrics.port) -}}
{{- end -}}
{{- end -}}
{{- if and $v.metrics.serviceMonitor.enabled $v.metrics.podMonitor.enabled -}}
{{- fail "metrics.serviceMonitor.enabled and metrics.podMonitor.enabled are both true: every sample would be scraped twice; enable one" -}}
{{- end -}}
{{- if and $v.metrics.serviceMonitor.enabled (not $v.metrics.service.enabled) -}}
{{- fail "metrics.serviceMonitor.enabled needs metrics.service.enabled=true (a ServiceMonitor scrapes through the Service); or use metrics.podMonitor" -}}
{{- end -}}
{{- range $name, $_ := $v.prometheusRule.overrides -}}
{{- if not (has $name (include "changelake.alertNames" $ | fromYamlArray)) -}}
{{- fail (printf "prometheusRule.overrides names %q, which is not an alert in files/prometheus/rules.yaml" $name) -}}
{{- end -}}
{{- end -}}
{{- range $v.prometheusRule.disabledAlerts -}}
{{- if not (has . (include "changelake.alertNames" $ | fromYamlArray)) -}}
{{- fail (printf "prometheusRule.disabledAlerts names %q, which is not an alert in files/prometheus/rules.yaml" .) -}}
{{- end -}}
{{- end -}}
{{- if and $v.sparkApplication.enabled (not $v.serviceAccount.create) (not $v.serviceAccount.name) -}}
{{- fail "sparkApplication mode needs a ServiceAccount allowed to create executor pods: set serviceAccount.create=true or name an existing one in serviceAccount.name" -}}
{{- end -}}
{{- end }}

{{/* The alert names defined in files/prometheus/rules.yaml, as a YAML list. */}}
{{- define "changelake.alertNames" -}}
{{- $names := list -}}
{{- range (.Files.Get "files/prometheus/rules.yaml" | fromYaml).groups -}}
{{- range .rules -}}
{{- if .alert }}{{ $names = append $names .alert }}{{ end -}}
{{- end -}}
{{- end -}}
{{- toYaml $names -}}
{{- end }}

{{/* Environment of the changelake container (StatefulSet pod and Spark driver/executors). */}}
{{- define "changelake.env" -}}
- name: CHANGELAKE_METRICS__PORT
  value: {{ .Values.metrics.port | quote }}
- name: SPARK_CONF_DIR
  value: {{ include "changelake.sparkConfDir" . }}
- name: CHANGELAKE_SCRATCH_DIR      # a local session's spark.local.dir and JVM temp: a killed one's are deleted at the next start
  value: /tmp/spark
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
{{- with .Values.secrets.kafkaSasl }}
{{- if .existingSecret }}
- name: CHANGELAKE_KAFKA__PROPERTIES__SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .usernameKey }}
- name: CHANGELAKE_KAFKA__PROPERTIES__SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .existingSecret }}
      key: {{ .passwordKey }}
{{- end }}
{{- end }}
{{- with .Values.secrets.kafkaTls }}
{{- if .existingSecret }}
- name: CHANGELAKE_KAFKA__PROPERTIES__SSL_CA_LOCATION
  value: {{ printf "%s/%s" .mountPath .caKey }}
{{- if .certKey }}
- name: CHANGELAKE_KAFKA__PROPERTIES__SSL_CERTIFICATE_LOCATION
  value: {{ printf "%s/%s" .mountPath .certKey }}
{{- end }}
{{- if .keyKey }}
- name: CHANGELAKE_KAFKA__PROPERTIES__SSL_KEY_LOCATION
  value: {{ printf "%s/%s" .mountPath .keyKey }}
{{- end }}
{{- end }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "changelake.envFrom" -}}
{{- if .Values.secrets.objectStorage.existingSecret }}
envFrom:
  - secretRef:
      name: {{ .Values.secrets.objectStorage.existingSecret }}
{{- end }}
{{- end }}

{{- define "changelake.volumeMounts" -}}
- name: config
  mountPath: {{ include "changelake.configDir" . }}/pipeline.yaml
  subPath: pipeline.yaml
  readOnly: true
- name: spark-conf
  mountPath: {{ include "changelake.sparkConfDir" . }}
  readOnly: true
- name: tmp
  mountPath: /tmp
- name: spark-local
  mountPath: /tmp/spark
{{- if .Values.secrets.kafkaTls.existingSecret }}
- name: kafka-tls
  mountPath: {{ .Values.secrets.kafkaTls.mountPath }}
  readOnly: true
{{- end }}
{{- with .Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "changelake.volumes" -}}
- name: config
  configMap:
    name: {{ include "changelake.fullname" . }}
    items:
      - key: pipeline.yaml
        path: pipeline.yaml
- name: spark-conf
  configMap:
    name: {{ include "changelake.fullname" . }}
    items:
      - key: spark-defaults.conf
        path: spark-defaults.conf
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.scratch.tmpSizeLimit }}
- name: spark-local
  emptyDir:
    sizeLimit: {{ .Values.scratch.sparkLocalSizeLimit }}
{{- if .Values.secrets.kafkaTls.existingSecret }}
- name: kafka-tls
  secret:
    secretName: {{ .Values.secrets.kafkaTls.existingSecret }}
    defaultMode: 0440
{{- end }}
{{- with .Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* spark-defaults.conf: memory settings of the chosen mode plus spark.conf. */}}
{{- define "changelake.sparkDefaults" -}}
{{- $conf := dict -}}
{{- if .Values.statefulset.enabled -}}
{{- $_ := set $conf "spark.master" .Values.spark.master -}}
{{- $_ := set $conf "spark.driver.memory" .Values.spark.driver.memory -}}
{{- $_ := set $conf "spark.executor.pyspark.memory" .Values.spark.executor.pysparkMemory -}}
{{- else -}}
{{- $sa := .Values.sparkApplication -}}
{{- $_ := set $conf "spark.driver.cores" ($sa.driver.cores | toString) -}}
{{- $_ := set $conf "spark.driver.memory" $sa.driver.memory -}}
{{- $_ := set $conf "spark.driver.memoryOverhead" $sa.driver.memoryOverhead -}}
{{- $_ := set $conf "spark.executor.cores" ($sa.executor.cores | toString) -}}
{{- $_ := set $conf "spark.executor.memory" $sa.executor.memory -}}
{{- $_ := set $conf "spark.executor.memoryOverhead" $sa.executor.memoryOverhead -}}
{{- $_ := set $conf "spark.executor.pyspark.memory" $sa.executor.pysparkMemory -}}
{{- end -}}
{{- range $k, $val := .Values.spark.conf -}}
{{- $_ := set $conf $k ($val | toString) -}}
{{- end -}}
{{- range $k := keys $conf | sortAlpha }}
{{ $k }} {{ get $conf $k }}
{{- end }}
{{- end }}

{{/* Probes on the metrics port: /healthz for startup, /livez for liveness (a stalled query), /readyz for readiness. */}}
{{- define "changelake.probes" -}}
{{- $p := .Values.probes -}}
startupProbe:
  httpGet:
    path: /healthz
    port: metrics
  periodSeconds: {{ $p.startup.periodSeconds }}
  failureThreshold: {{ $p.startup.failureThreshold }}
livenessProbe:
  httpGet:
    path: /livez
    port: metrics
  periodSeconds: {{ $p.liveness.periodSeconds }}
  timeoutSeconds: {{ $p.liveness.timeoutSeconds }}
  failureThreshold: {{ $p.liveness.failureThreshold }}
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  periodSeconds: {{ $p.readiness.periodSeconds }}
  timeoutSeconds: {{ $p.readiness.timeoutSeconds }}
  failureThreshold: {{ $p.readiness.failureThreshold }}
{{- end }}

{{/* Scrape relabeling: the pod's pipeline label becomes the "pipeline" target label the alerts group by. */}}
{{- define "changelake.relabelings" -}}
- sourceLabels: [__meta_kubernetes_pod_label_changelake_io_pipeline]
  targetLabel: pipeline
- sourceLabels: [__meta_kubernetes_pod_name]
  targetLabel: pod
{{- end }}

{{/* Marks the metrics Service, so a ServiceMonitor never also scrapes the headless Service. */}}
{{- define "changelake.metricsServiceLabel" -}}
changelake.io/scrape: "true"
{{- end }}

{{/* The image's jars a SparkApplication adds to Spark's classpath, as local:// URIs (empty: none): the
spark-kafka set when the pipeline's kafka.reader is spark-kafka. The list is files/jvm-jars.yaml, written from
jvm/jvm.lock (python -m changelake.jvm_deps chart); delta's jars are in Spark's own jars/ directory of the image. */}}
{{- define "changelake.sparkJars" -}}
{{- $kafka := .Values.pipeline.kafka | default dict -}}
{{- if eq ($kafka.reader | default "python") "spark-kafka" -}}
{{- $jvm := .Files.Get "files/jvm-jars.yaml" | fromYaml -}}
{{- $jars := list -}}
{{- range (index $jvm.sets "spark-kafka") -}}
{{- $jars = append $jars (printf "local://%s/spark-kafka/%s" $jvm.home .) -}}
{{- end -}}
{{- join "," $jars -}}
{{- end -}}
{{- end }}
