{{/* Names, labels and shared snippets of the FlowForge chart. */}}

{{- define "flowforge.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "flowforge.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Cluster-scoped objects carry the namespace too: two releases of the same name in two
     namespaces must not fight over one ClusterRole or webhook configuration. */}}
{{- define "flowforge.clusterName" -}}
{{- printf "%s-%s" (include "flowforge.fullname" .) .Release.Namespace | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "flowforge.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "flowforge.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: flowforge
{{- end -}}

{{- define "flowforge.selectorLabels" -}}
app.kubernetes.io/name: {{ include "flowforge.name" .context }}
app.kubernetes.io/instance: {{ .context.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "flowforge.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "flowforge.operatorServiceAccountName" -}}
{{- if .Values.operator.serviceAccount.create -}}
{{- default (printf "%s-operator" (include "flowforge.fullname" .)) .Values.operator.serviceAccount.name -}}
{{- else -}}
{{- required "operator.serviceAccount.name is required when operator.serviceAccount.create is false" .Values.operator.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "flowforge.webhookServiceAccountName" -}}
{{- if .Values.webhook.serviceAccount.create -}}
{{- default (printf "%s-webhook" (include "flowforge.fullname" .)) .Values.webhook.serviceAccount.name -}}
{{- else -}}
{{- required "webhook.serviceAccount.name is required when webhook.serviceAccount.create is false" .Values.webhook.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "flowforge.webhookServiceName" -}}
{{- printf "%s-webhook" (include "flowforge.fullname" .) -}}
{{- end -}}

{{- define "flowforge.webhookSecretName" -}}
{{- printf "%s-webhook-tls" (include "flowforge.fullname" .) -}}
{{- end -}}

{{- define "flowforge.postgresqlName" -}}
{{- printf "%s-postgresql" (include "flowforge.fullname" .) -}}
{{- end -}}

{{/* The bundled PostgreSQL's login per component and its group role (store/roles.py);
  the migrator is the database's owner. Each login's Secret is "<postgresqlName>-<component>"
  (keys login, password, dsn). */}}
{{- define "flowforge.bundledLogins" -}}
operator: {login: ff_operator, group: flowforge_operator}
webhook: {login: ff_webhook, group: flowforge_webhook}
server: {login: ff_server, group: flowforge_server}
{{- end -}}

{{/* The Secret and key holding the PostgreSQL DSN. */}}
{{- define "flowforge.databaseSecretName" -}}
{{- if .Values.database.bundled.enabled -}}
{{- include "flowforge.postgresqlName" . -}}
{{- else -}}
{{- required "database.existingSecret must name a Secret holding the PostgreSQL DSN (or set database.bundled.enabled=true to try FlowForge out)" .Values.database.existingSecret -}}
{{- end -}}
{{- end -}}

{{- define "flowforge.databaseSecretKey" -}}
{{- if .Values.database.bundled.enabled -}}dsn{{- else -}}{{ .Values.database.secretKey }}{{- end -}}
{{- end -}}

{{- define "flowforge.dsnEnv" -}}
- name: FLOWFORGE_DSN
  valueFrom:
    secretKeyRef:
      name: {{ include "flowforge.databaseSecretName" . }}
      key: {{ include "flowforge.databaseSecretKey" . }}
{{- end -}}

{{/* FLOWFORGE_DSN of one component (dict "context" . "component" "operator"): with the
  bundled database its own login's Secret (the migrator: the owner's); else its own Secret
  (database.components.<component>) when set, else the shared one. Each component's login
  role is a member of its group role (store/roles.py in the FlowForge package). */}}
{{- define "flowforge.componentDsnEnv" -}}
{{- $context := .context -}}
{{- $own := index $context.Values.database.components .component | default dict -}}
{{- $bundled := $context.Values.database.bundled.enabled -}}
- name: FLOWFORGE_DSN
  valueFrom:
    secretKeyRef:
      {{- if and $bundled (ne .component "migrator") }}
      name: {{ printf "%s-%s" (include "flowforge.postgresqlName" $context) .component }}
      key: dsn
      {{- else if and $own.existingSecret (not $bundled) }}
      name: {{ $own.existingSecret }}
      key: {{ $own.secretKey | default "dsn" }}
      {{- else }}
      name: {{ include "flowforge.databaseSecretName" $context }}
      key: {{ include "flowforge.databaseSecretKey" $context }}
      {{- end }}
{{- end -}}

{{/* The migrate command, bounded by the lock timeout. */}}
{{- define "flowforge.migrateCommand" -}}
[flowforge, db, migrate, --lock-timeout, {{ printf "%ds" (int .Values.migrations.lockTimeoutSeconds) | quote }}]
{{- end -}}

{{/* The init container that applies the schema migrations before the main container
  (migrations.mode initContainer), as the migrator. */}}
{{- define "flowforge.migrateInitContainer" -}}
{{- if and .Values.migrations.enabled (eq .Values.migrations.mode "initContainer") }}
initContainers:
  - name: migrate
    image: {{ include "flowforge.image" . }}
    imagePullPolicy: {{ .Values.image.pullPolicy }}
    command: {{ include "flowforge.migrateCommand" . }}
    env:
      {{- include "flowforge.componentDsnEnv" (dict "context" . "component" "migrator") | nindent 6 }}
    securityContext:
      {{- toYaml .Values.containerSecurityContext | nindent 6 }}
    resources:
      requests: {cpu: 50m, memory: 96Mi}
      limits: {memory: 256Mi}
{{- end }}
{{- end -}}

{{/* In namespaced mode the webhooks only see the watched namespaces. */}}
{{- define "flowforge.webhookNamespaceSelector" -}}
namespaceSelector:
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: In
      values:
        {{- toYaml .Values.watchNamespaces | nindent 8 }}
{{- end -}}

{{/* How the webhook checks its clients, one of: existingConfigMap, caCert (a CA given in the
values), certManager or generated (the chart makes a client CA and the certificate the
apiserver presents), none (any client: only with webhook.clientAuth.acceptAnyClient). A
webhook that would accept any client without that explicit value is refused at render. */}}
{{- define "flowforge.webhookClientAuthMode" -}}
{{- $auth := .Values.webhook.clientAuth -}}
{{- if $auth.acceptAnyClient -}}
{{- if or $auth.caCert $auth.existingConfigMap -}}
{{- fail "webhook.clientAuth: acceptAnyClient=true contradicts caCert/existingConfigMap; set one or the other" -}}
{{- end -}}
none
{{- else if $auth.existingConfigMap -}}
existingConfigMap
{{- else if $auth.caCert -}}
caCert
{{- else if $auth.generate -}}
{{- if .Values.webhook.certManager.enabled }}certManager{{ else }}generated{{ end -}}
{{- else -}}
{{- fail "webhook.clientAuth: no client CA (caCert, existingConfigMap or generate=true), so the webhook would answer any client; set webhook.clientAuth.acceptAnyClient=true to allow that explicitly (kind, demos)" -}}
{{- end -}}
{{- end -}}

{{- define "flowforge.webhookClientSecretName" -}}
{{- include "flowforge.fullname" . }}-webhook-client
{{- end -}}

{{/* The volume source of the CA file the webhook checks client certificates against (key
ca.crt); empty when any client is accepted. */}}
{{- define "flowforge.webhookClientCAVolume" -}}
{{- $mode := include "flowforge.webhookClientAuthMode" . -}}
{{- if eq $mode "existingConfigMap" -}}
configMap:
  name: {{ .Values.webhook.clientAuth.existingConfigMap }}
  items:
    - {key: ca.crt, path: ca.crt}
{{- else if eq $mode "certManager" -}}
secret:
  secretName: {{ include "flowforge.webhookClientSecretName" . }}
  items:
    - {key: ca.crt, path: ca.crt}
{{- else if ne $mode "none" -}}
configMap:
  name: {{ include "flowforge.fullname" . }}-webhook-client-ca
  items:
    - {key: ca.crt, path: ca.crt}
{{- end -}}
{{- end -}}

{{- define "flowforge.serverServiceAccountName" -}}
{{- if .Values.server.serviceAccount.create -}}
{{- default (printf "%s-server" (include "flowforge.fullname" .)) .Values.server.serviceAccount.name -}}
{{- else -}}
{{- required "server.serviceAccount.name is required when server.serviceAccount.create is false" .Values.server.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* OTEL_RESOURCE_ATTRIBUTES from a map: key=value pairs, comma-separated, sorted. */}}
{{- define "flowforge.otelResourceAttributes" -}}
{{- $pairs := list -}}
{{- range $key, $value := . -}}
{{- $pairs = append $pairs (printf "%s=%s" $key (toString $value)) -}}
{{- end -}}
{{- join "," $pairs -}}
{{- end -}}
