{{/*
Names and labels.
*/}}
{{- define "nvshare.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "nvshare.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels of one component: (list . "scheduler"). */}}
{{- define "nvshare.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ $root.Chart.Name }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{/*
The nodes of both DaemonSets: nodeSelector, and beside NVIDIA's GPU Operator only nodes where the
operator's own device plugin is turned off, so that no GPU is handed out by both plugins.
*/}}
{{- define "nvshare.nodeSelector" -}}
{{- $selector := deepCopy (.Values.nodeSelector | default dict) -}}
{{- if eq (toString .Values.gpuOperator.enabled) "true" -}}
{{- $_ := set $selector "nvidia.com/gpu.deploy.device-plugin" "false" -}}
{{- end -}}
{{- toYaml $selector -}}
{{- end -}}

{{- define "nvshare.image" -}}
{{- $repository := required "image.repository is required: the registry path of the image built from deploy/docker/Dockerfile (make image), e.g. --set image.repository=registry.example.com/nvshare" .Values.image.repository -}}
{{- printf "%s:%s" $repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "nvshare.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (printf "%s-device-plugin" (include "nvshare.fullname" .)) -}}
{{- end -}}

{{/*
Knob tables: Helm value (camelCase of the knob's name) -> the program's environment variable.
Every knob of src/scheduler/knobs.cc and src/deviceplugin/knobs.cc is listed once;
tests/k8s/deploy/check_chart.py fails when a knob is missing, misnamed or has no value in values.yaml.
*/}}
{{- define "nvshare.schedulerKnobs" -}}
socket: NVSHARE_SOCKET
controlSocket: NVSHARE_CONTROL_SOCKET
stateFile: NVSHARE_STATE_FILE
gpus: NVSHARE_GPUS
mode: NVSHARE_MODE
reserve: NVSHARE_RESERVE
capacity: NVSHARE_CAPACITY
quantum: NVSHARE_QUANTUM
quantumK: NVSHARE_QUANTUM_K
quantumMin: NVSHARE_QUANTUM_MIN
quantumMax: NVSHARE_QUANTUM_MAX
turnSlice: NVSHARE_TURN_SLICE
capCycle: NVSHARE_CAP_CYCLE
priorityInterference: NVSHARE_PRIORITY_INTERFERENCE
priorityFloor: NVSHARE_PRIORITY_FLOOR
quotaWindow: NVSHARE_QUOTA_WINDOW
revokeGrace: NVSHARE_REVOKE_GRACE
swapAllowanceMax: NVSHARE_SWAP_ALLOWANCE_MAX
swapBandwidth: NVSHARE_SWAP_BANDWIDTH
swapBandwidthFloor: NVSHARE_SWAP_BANDWIDTH_FLOOR
trustClientLimits: NVSHARE_TRUST_CLIENT_LIMITS
memoryMode: NVSHARE_MEMORY_MODE
clientBufferLimit: NVSHARE_CLIENT_BUFFER_LIMIT
helloTimeout: NVSHARE_HELLO_TIMEOUT
maxSessionsPerUid: NVSHARE_MAX_SESSIONS_PER_UID
maxSessionsPerPod: NVSHARE_MAX_SESSIONS_PER_POD
logLevel: NVSHARE_LOG_LEVEL
metricsAddress: NVSHARE_METRICS_ADDRESS
{{- end -}}

{{- define "nvshare.devicePluginKnobs" -}}
resourceName: NVSHARE_PLUGIN_RESOURCE_NAME
slotsPerGpu: NVSHARE_PLUGIN_SLOTS_PER_GPU
failRequestsGreaterThanOne: NVSHARE_PLUGIN_FAIL_REQUESTS_GREATER_THAN_ONE
gpus: NVSHARE_PLUGIN_GPUS
memoryCapacity: NVSHARE_PLUGIN_MEMORY_CAPACITY
kubeletDir: NVSHARE_PLUGIN_KUBELET_DIR
podResourcesSocket: NVSHARE_PLUGIN_POD_RESOURCES_SOCKET
libraryHostPath: NVSHARE_PLUGIN_LIBRARY_HOST_PATH
libraryContainerPath: NVSHARE_PLUGIN_LIBRARY_CONTAINER_PATH
injection: NVSHARE_PLUGIN_INJECTION
deviceListStrategy: NVSHARE_PLUGIN_DEVICE_LIST_STRATEGY
cdiGpuKind: NVSHARE_PLUGIN_CDI_GPU_KIND
cdiSpecDir: NVSHARE_PLUGIN_CDI_SPEC_DIR
cdiEdits: NVSHARE_PLUGIN_CDI_EDITS
ldSoPreloadHostPath: NVSHARE_PLUGIN_LD_SO_PRELOAD_HOST_PATH
socketDir: NVSHARE_PLUGIN_SOCKET_DIR
controlSocket: NVSHARE_PLUGIN_CONTROL_SOCKET
settingsDir: NVSHARE_PLUGIN_SETTINGS_DIR
clientRegisterWait: NVSHARE_PLUGIN_CLIENT_REGISTER_WAIT
nodeName: NVSHARE_PLUGIN_NODE_NAME
kubeconfig: NVSHARE_PLUGIN_KUBECONFIG
healthInterval: NVSHARE_PLUGIN_HEALTH_INTERVAL
watchTimeout: NVSHARE_PLUGIN_WATCH_TIMEOUT
metricsAddress: NVSHARE_PLUGIN_METRICS_ADDRESS
logLevel: NVSHARE_PLUGIN_LOG_LEVEL
{{- end -}}

{{/*
The env entries of the knobs that are set: (list <values section> <knob table text>). An empty or
null value emits nothing, so the program's own default applies. Numbers that YAML made floats are
written back as integers when they are whole ("3600000", never "3.6e+06").
*/}}
{{- define "nvshare.knobEnv" -}}
{{- $values := index . 0 -}}
{{- $table := index . 1 | fromYaml -}}
{{- range $key, $env := $table }}
{{- $value := index $values $key }}
{{- if not (kindIs "invalid" $value) }}
{{- $text := toString $value }}
{{- if kindIs "float64" $value }}
{{- if eq $value (floor $value) }}
{{- $text = int64 $value | toString }}
{{- end }}
{{- end }}
{{- if ne $text "" }}
- name: {{ $env }}
  value: {{ $text | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/*
Host paths the chart mounts. Each is the knob's value when set, else the program's default; the
literals below are those defaults (check_chart.py fails when they and the knob tables disagree).
*/}}
{{- define "nvshare.socketDir" -}}
{{- .Values.devicePlugin.socketDir | default "/var/run/nvshare" | trimSuffix "/" -}}
{{- end -}}

{{- define "nvshare.schedulerSocket" -}}
{{- .Values.scheduler.socket | default "/var/run/nvshare/scheduler.sock" -}}
{{- end -}}

{{- define "nvshare.schedulerControlSocket" -}}
{{- .Values.scheduler.controlSocket | default "/var/run/nvshare-control/control.sock" -}}
{{- end -}}

{{- define "nvshare.pluginControlSocket" -}}
{{- .Values.devicePlugin.controlSocket | default "/var/run/nvshare-control/control.sock" -}}
{{- end -}}

{{/* The scheduler's state directory on the host (the state file's directory). */}}
{{- define "nvshare.stateDir" -}}
{{- dir (.Values.scheduler.stateFile | default "/var/lib/nvshare/scheduler/state.json") -}}
{{- end -}}

{{- define "nvshare.settingsDir" -}}
{{- .Values.devicePlugin.settingsDir | default "/var/lib/nvshare/containers" | trimSuffix "/" -}}
{{- end -}}

{{- define "nvshare.kubeletDir" -}}
{{- .Values.devicePlugin.kubeletDir | default "/var/lib/kubelet/device-plugins" | trimSuffix "/" -}}
{{- end -}}

{{- define "nvshare.podResourcesSocket" -}}
{{- .Values.devicePlugin.podResourcesSocket | default "/var/lib/kubelet/pod-resources/kubelet.sock" -}}
{{- end -}}

{{- define "nvshare.libraryHostPath" -}}
{{- .Values.devicePlugin.libraryHostPath | default "/var/lib/nvshare/lib/libnvshare.so" -}}
{{- end -}}

{{- define "nvshare.ldSoPreloadHostPath" -}}
{{- .Values.devicePlugin.ldSoPreloadHostPath | default "/var/lib/nvshare/preload/ld.so.preload" -}}
{{- end -}}

{{/* "true" when the plugin writes nvshare's CDI spec (cdi-cri among the strategies, cdi-edits on). */}}
{{- define "nvshare.cdiEdits" -}}
{{- $strategies := splitList "," (.Values.devicePlugin.deviceListStrategy | default "cdi-cri") -}}
{{- and (has "cdi-cri" $strategies) (ne (toString .Values.devicePlugin.cdiEdits) "false") -}}
{{- end -}}

{{- define "nvshare.cdiSpecDir" -}}
{{- .Values.devicePlugin.cdiSpecDir | default "/var/run/cdi" | trimSuffix "/" -}}
{{- end -}}

{{- define "nvshare.injection" -}}
{{- .Values.devicePlugin.injection | default "ld-preload" -}}
{{- end -}}

{{/*
The socket directory serves the scheduler and every GPU container (read-only), so the socket knobs of
the two programs must agree; rendering stops with a message when they do not. The control socket
admits root, so its directory is another one, mounted into the scheduler and the plugin only; a
control socket inside the socket directory would reach every GPU container and is refused, and so is
one in a parent of the socket directory (the chart would mount that whole parent).
*/}}
{{- define "nvshare.checkSockets" -}}
{{- $dir := include "nvshare.socketDir" . -}}
{{- $socket := include "nvshare.schedulerSocket" . -}}
{{- $control := include "nvshare.schedulerControlSocket" . -}}
{{- if ne $socket (printf "%s/scheduler.sock" $dir) -}}
{{- fail (printf "scheduler.socket (%s) must be <devicePlugin.socketDir>/scheduler.sock (%s/scheduler.sock): GPU containers are given that path" $socket $dir) -}}
{{- end -}}
{{- if ne $control (include "nvshare.pluginControlSocket" .) -}}
{{- fail (printf "scheduler.controlSocket (%s) and devicePlugin.controlSocket (%s) must be the same socket" $control (include "nvshare.pluginControlSocket" .)) -}}
{{- end -}}
{{- if hasPrefix (printf "%s/" $dir) (clean $control) -}}
{{- fail (printf "scheduler.controlSocket (%s) must lie outside devicePlugin.socketDir (%s), which every GPU container gets: the control socket admits root" $control $dir) -}}
{{- end -}}
{{- if hasPrefix (printf "%s/" (dir (clean $control) | trimSuffix "/")) $dir -}}
{{- fail (printf "scheduler.controlSocket (%s) must lie in a directory of its own, not in a parent of devicePlugin.socketDir (%s): the chart mounts that directory into the scheduler and the plugin" $control $dir) -}}
{{- end -}}
{{- end -}}

{{/* The control socket's directory on the host. */}}
{{- define "nvshare.controlDir" -}}
{{- dir (include "nvshare.schedulerControlSocket" .) -}}
{{- end -}}

{{/*
The device plugin's settings that would crash-loop on this cluster or reach further than they must:
cdi-cri names devices through the CRI's CDI field, which the kubelet passes on from Kubernetes 1.31;
in ld-so-preload mode the preload file's directory is mounted writable into the plugin, so it must be
one of its own, holding neither the scheduler's state nor the containers' settings, the sockets or the
library.
*/}}
{{- define "nvshare.checkDevicePlugin" -}}
{{- $strategies := splitList "," (.Values.devicePlugin.deviceListStrategy | default "cdi-cri") -}}
{{- if and (has "cdi-cri" $strategies) (semverCompare "<1.31-0" .Capabilities.KubeVersion.Version) -}}
{{- fail (printf "devicePlugin.deviceListStrategy cdi-cri (the default) needs Kubernetes 1.31 or later, and this cluster is %s: set devicePlugin.deviceListStrategy=envvar (the NVIDIA runtime as the pods' runtime) or volume-mounts (docs/kubernetes.md)" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- if eq (include "nvshare.injection" .) "ld-so-preload" -}}
{{- $preloadDir := dir (include "nvshare.ldSoPreloadHostPath" .) | clean -}}
{{- $others := dict "the scheduler's state" (include "nvshare.stateDir" .) "the containers' settings" (include "nvshare.settingsDir" .) "the socket directory" (include "nvshare.socketDir" .) "the control socket" (include "nvshare.controlDir" .) "the library" (dir (include "nvshare.libraryHostPath" .)) -}}
{{- range $what, $path := $others -}}
{{- $path = clean $path -}}
{{- if or (eq $path $preloadDir) (hasPrefix (printf "%s/" $preloadDir) $path) -}}
{{- fail (printf "devicePlugin.ldSoPreloadHostPath must lie in a directory of its own: its directory %s, mounted writable into the device plugin, holds %s (%s)" $preloadDir $what $path) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
