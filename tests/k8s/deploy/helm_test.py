#!/usr/bin/env python3
"""The chart under the real helm: lint, render, and what the rendered objects hold.

  helm_test.py REPOSITORY_ROOT HELM [MODELS_DIR]

  - `helm lint --strict`, with the defaults and with overrides;
  - `helm template` with the defaults: exactly the expected objects, in the release's namespace; no
    knob variable set (the programs' own defaults apply); the host directories the programs use by
    default mounted where they expect them;
  - `helm template` with overrides: each value reaches its variable in the right container, and a
    moved socket directory moves every mount and variable that names it;
  - what some clusters need (the namespace's Pod Security labels, GKE's quota for the priority
    class, OpenShift's SCC, an SELinux type, NVIDIA's GPU Operator beside) rendered when asked
    for and only then;
  - settings the chart must refuse (the two control sockets differ, the control socket inside the
    socket directory) make `helm template` fail with a message naming them.
  - with MODELS_DIR (kubernetes-models, fetch_k8s_models.sh), every rendered object is validated
    against the Kubernetes OpenAPI schemas by validate_k8s.mjs.
The rendered YAML is read with check_chart.py's parser (and PyYAML too, when installed).
Exit status 0 when everything holds, 1 otherwise (each failure is printed).
"""

import importlib.util
import json
import os
import subprocess
import sys
import tempfile

FAILURES = []
CHART = "deploy/helm/nvshare"
NAMESPACE = "gpu-sharing"


def fail(message):
    FAILURES.append(message)


def load_checker(root):
    path = os.path.join(root, "tests/k8s/deploy/check_chart.py")
    spec = importlib.util.spec_from_file_location("check_chart", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def helm(helm_path, root, args):
    return subprocess.run([helm_path, *args], cwd=root, capture_output=True, text=True, check=False)


# The chart has no default image: every render names one, unless a case sets it to None.
REPOSITORY = "registry.example.com/nvshare"


def sets(overrides):
    args = []
    for key, value in {"image.repository": REPOSITORY, **overrides}.items():
        if value is not None:
            args += ["--set-string", f"{key}={value}"]
    return args


# The kubernetes-models package (validate_k8s.mjs) when given: every render is validated against the
# Kubernetes OpenAPI schemas.
MODELS = {"dir": None, "checked": 0, "skipped": set()}


def validate(root, docs, label):
    if not MODELS["dir"] or not docs:
        return
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(docs, f)
        path = f.name
    try:
        done = subprocess.run(["node", os.path.join(root, "tests/k8s/deploy/validate_k8s.mjs"),
                               MODELS["dir"], path], capture_output=True, text=True, check=False)
    finally:
        os.unlink(path)
    for line in done.stdout.splitlines():
        if line.startswith("INVALID"):
            fail(f"{label}: {line}")
        elif line.startswith("valid"):
            MODELS["checked"] += 1
        elif line.startswith("not checked"):
            MODELS["skipped"].add(line.split(": ", 1)[1].split(" (")[0].split()[0])
    if done.returncode not in (0, 1):
        fail(f"{label}: validate_k8s.mjs failed: {done.stderr.strip()}")


def render(checker, helm_path, root, overrides, label, typed=()):
    """`overrides` as strings (--set-string); `typed` as --set KEY=VALUE (booleans, numbers)."""
    typed_args = [arg for item in typed for arg in ("--set", item)]
    done = helm(helm_path, root, ["template", "rel", CHART, "--namespace", NAMESPACE,
                                  *sets(overrides), *typed_args])
    if done.returncode != 0:
        fail(f"{label}: helm template failed: {done.stderr.strip()}")
        return []
    before = len(checker.FAILURES)
    docs = checker.load_yaml(label, done.stdout) or []
    for message in checker.FAILURES[before:]:
        fail(message)
    validate(root, docs, label)
    return docs


def by_kind(docs):
    out = {}
    for doc in docs:
        out.setdefault(doc.get("kind"), []).append(doc)
    return out


def daemonset(docs, suffix):
    for doc in docs:
        if doc.get("kind") == "DaemonSet" and doc["metadata"]["name"].endswith(suffix):
            return doc
    fail(f"no DaemonSet named *{suffix}")
    return None


def container(ds, name):
    for c in (ds or {}).get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
        if c.get("name") == name:
            return c
    fail(f"no container {name}")
    return {}


def env_of(c):
    return {e["name"]: e.get("value") for e in c.get("env", []) or []}


def host_paths(ds):
    volumes = (ds or {}).get("spec", {}).get("template", {}).get("spec", {}).get("volumes", [])
    return {v["name"]: v["hostPath"]["path"] for v in volumes or [] if "hostPath" in v}


def mounts_by_host_path(ds):
    """{host path: sorted (container, mount path, read-only)} of every container of a DaemonSet."""
    paths = {name: path for name, path in host_paths(ds).items()}
    spec = (ds or {}).get("spec", {}).get("template", {}).get("spec", {})
    out = {}
    for c in spec.get("initContainers", []) + spec.get("containers", []):
        for m in c.get("volumeMounts", []):
            if m["name"] in paths:
                out.setdefault(paths[m["name"]], []).append(
                    (c["name"], m["mountPath"], bool(m.get("readOnly", False))))
    return {k: sorted(v) for k, v in out.items()}


def check_lint(helm_path, root):
    for label, overrides in [("defaults", {}),
                             ("overrides", {"devicePlugin.slotsPerGpu": "4",
                                            "scheduler.mode": "exclusive"})]:
        done = helm(helm_path, root, ["lint", "--strict", CHART, *sets(overrides)])
        if done.returncode != 0:
            fail(f"helm lint --strict ({label}) failed:\n{done.stdout}{done.stderr}")
        else:
            print(f"helm lint --strict ({label}): ok")


def check_defaults(checker, helm_path, root):
    docs = render(checker, helm_path, root, {}, "defaults")
    kinds = {kind: len(items) for kind, items in by_kind(docs).items()}
    expected = {"ServiceAccount": 1, "ClusterRole": 1, "ClusterRoleBinding": 1, "DaemonSet": 2,
                "Service": 2, "NetworkPolicy": 1}
    if kinds != expected:
        fail(f"defaults: rendered {kinds}, expected {expected}")
    for doc in docs:
        namespaced = doc["kind"] not in ("ClusterRole", "ClusterRoleBinding")
        if namespaced and doc["metadata"].get("namespace") != NAMESPACE:
            fail(f"defaults: {doc['kind']} {doc['metadata']['name']} is not in {NAMESPACE}")
    scheduler = daemonset(docs, "-scheduler")
    plugin = daemonset(docs, "-device-plugin")
    # The programs' defaults apply, but for the metrics endpoints, which the chart turns on.
    for ds, name, chart_set in ((scheduler, "scheduler", {"NVSHARE_METRICS_ADDRESS": ":9402"}),
                                (plugin, "device-plugin", {"NVSHARE_PLUGIN_METRICS_ADDRESS": ":9403"})):
        env = env_of(container(ds, name))
        knobs = {k: v for k, v in env.items() if k.startswith("NVSHARE_")}
        if knobs != chart_set:
            fail(f"defaults: the {name} container sets {knobs}, expected {chart_set}")
    want_scheduler = {"/var/run/nvshare", "/var/run/nvshare-control", "/var/lib/nvshare/scheduler"}
    if not want_scheduler <= set(host_paths(scheduler).values()):
        fail(f"defaults: scheduler host paths {sorted(host_paths(scheduler).values())} miss "
             f"{sorted(want_scheduler - set(host_paths(scheduler).values()))}")
    want_plugin = {"/var/lib/kubelet/device-plugins", "/var/run/nvshare-control",
                   "/var/lib/nvshare/containers", "/var/lib/nvshare/lib", "/var/run/cdi"}
    if not want_plugin <= set(host_paths(plugin).values()):
        fail(f"defaults: device plugin host paths {sorted(host_paths(plugin).values())} miss "
             f"{sorted(want_plugin - set(host_paths(plugin).values()))}")
    # The plain manifests are the chart's defaults written out: the same host directories, mounted
    # at the same places with the same access (a directory the plugin writes must be writable).
    manifests = checker.load_yaml("manifests", open(os.path.join(root, "deploy/manifests/nvshare.yaml")).read())
    for suffix, rendered in (("-scheduler", scheduler), ("-device-plugin", plugin)):
        written = daemonset(manifests or [], suffix)
        if mounts_by_host_path(written) != mounts_by_host_path(rendered):
            fail(f"defaults: deploy/manifests/nvshare.yaml's *{suffix} mounts "
                 f"{mounts_by_host_path(written)}, the chart's defaults {mounts_by_host_path(rendered)}")
    print(f"helm template (defaults): {kinds}; the plain manifests mount the same host directories")


# Each component with a metrics endpoint: DaemonSet suffix, container, values section, port value
# and default, and the variable that carries its address.
METRICS_COMPONENTS = [("-scheduler", "scheduler", "scheduler", "port", 9402, "NVSHARE_METRICS_ADDRESS"),
                      ("-device-plugin", "device-plugin", "devicePlugin", "pluginPort", 9403,
                       "NVSHARE_PLUGIN_METRICS_ADDRESS")]


def check_metrics(checker, helm_path, root):
    """The metrics endpoints of the scheduler and the device plugin: port, scrape annotations and a
    headless Service each by default; a ServiceMonitor each when asked for; nothing when metrics
    are off; an explicit address wins."""
    docs = render(checker, helm_path, root, {}, "metrics")
    services = by_kind(docs).get("Service", [])
    if len(services) != 2:
        fail(f"metrics: {len(services)} Services rendered, expected 2")
    if by_kind(docs).get("ServiceMonitor"):
        fail("metrics: a ServiceMonitor was rendered without serviceMonitor.enabled")
    monitor_docs = render(checker, helm_path, root, {"metrics.serviceMonitor.labels.release": "prom"},
                          "service monitor",
                          typed=["metrics.serviceMonitor.enabled=true", "metrics.port=9500",
                                 "metrics.pluginPort=9501"])
    monitors = by_kind(monitor_docs).get("ServiceMonitor", [])
    if len(monitors) != 2:
        fail(f"metrics: {len(monitors)} ServiceMonitors with serviceMonitor.enabled, expected 2")
    for suffix, name, section, port_value, port, variable in METRICS_COMPONENTS:
        ds = daemonset(docs, suffix)
        c = container(ds, name)
        ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
        if ports != {"metrics": port}:
            fail(f"metrics: {name} container ports {ports}, expected metrics: {port}")
        annotations = ds["spec"]["template"]["metadata"].get("annotations", {})
        want = {"prometheus.io/scrape": "true", "prometheus.io/port": str(port),
                "prometheus.io/path": "/metrics"}
        if any(annotations.get(k) != v for k, v in want.items()):
            fail(f"metrics: {name} pod annotations {annotations}, expected {want}")
        pod_labels = ds["spec"]["template"]["metadata"]["labels"]
        mine = [svc for svc in services
                if all(pod_labels.get(k) == v for k, v in svc["spec"]["selector"].items())]
        if len(mine) != 1:
            fail(f"metrics: {len(mine)} Services select the {name} pods, expected 1")
        elif [(p["name"], p["port"], p["targetPort"]) for p in mine[0]["spec"]["ports"]] != [("metrics", port, "metrics")]:
            fail(f"metrics: {name} Service ports {mine[0]['spec']['ports']}")

        # The ServiceMonitor for this component selects its Service.
        moved = port + 98  # 9500 / 9501
        service = [svc for svc in by_kind(monitor_docs).get("Service", [])
                   if svc["metadata"]["name"].endswith(suffix + "-metrics")]
        found = [m for m in monitors
                 if service and all(service[0]["metadata"]["labels"].get(k) == v
                                    for k, v in m["spec"]["selector"]["matchLabels"].items())]
        if len(found) != 1:
            fail(f"metrics: {len(found)} ServiceMonitors select the {name} Service, expected 1")
        else:
            m = found[0]
            if m["metadata"]["labels"].get("release") != "prom":
                fail(f"metrics: ServiceMonitor labels {m['metadata']['labels']} lack release: prom")
            if [e.get("port") for e in m["spec"]["endpoints"]] != ["metrics"]:
                fail(f"metrics: ServiceMonitor endpoints {m['spec']['endpoints']}")
        env = env_of(container(daemonset(monitor_docs, suffix), name))
        if env.get(variable) != f":{moved}":
            fail(f"metrics: metrics.{port_value} {moved} gave {variable}={env.get(variable)}")

        explicit = render(checker, helm_path, root, {f"{section}.metricsAddress": "127.0.0.1:9600"},
                          "address")
        env = env_of(container(daemonset(explicit, suffix), name))
        if env.get(variable) != "127.0.0.1:9600":
            fail(f"metrics: {section}.metricsAddress gave {variable}={env.get(variable)}")

    # Only the named scrapers reach the metrics ports, on both components' pods.
    policies = by_kind(docs).get("NetworkPolicy", [])
    if len(policies) != 1:
        fail(f"metrics: {len(policies)} NetworkPolicies by default, expected 1")
    else:
        spec = policies[0]["spec"]
        ingress = spec.get("ingress", [])
        ports = sorted(p["port"] for rule in ingress for p in rule.get("ports", []))
        peers = [peer for rule in ingress for peer in rule.get("from", [])]
        if spec.get("policyTypes") != ["Ingress"] or ports != [9402, 9403] or len(ingress) != 1:
            fail(f"metrics: the NetworkPolicy admits {ingress}")
        if peers != [{"namespaceSelector": {}, "podSelector": {"matchLabels": {
                "app.kubernetes.io/name": "prometheus"}}}]:
            fail(f"metrics: the NetworkPolicy's scrapers are {peers}")
        for suffix in ("-scheduler", "-device-plugin"):
            labels = daemonset(docs, suffix)["spec"]["template"]["metadata"]["labels"]
            if not all(labels.get(e["key"]) in e["values"] for e in spec["podSelector"]["matchExpressions"]):
                fail(f"metrics: the NetworkPolicy does not select the *{suffix} pods")
    unguarded = render(checker, helm_path, root, {}, "no network policy",
                       typed=["metrics.networkPolicy.enabled=false"])
    if by_kind(unguarded).get("NetworkPolicy"):
        fail("metrics: metrics.networkPolicy.enabled=false still rendered a NetworkPolicy")
    off = render(checker, helm_path, root, {}, "metrics off", typed=["metrics.enabled=false"])
    if by_kind(off).get("Service") or by_kind(off).get("NetworkPolicy"):
        fail("metrics: metrics.enabled=false still rendered a Service or a NetworkPolicy")
    for doc in off:
        for c in doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
            if "env" in c and not isinstance(c["env"], list):
                fail(f"metrics: metrics.enabled=false rendered env {c['env']!r} in {c['name']}")
    for suffix, name, _, _, _, variable in METRICS_COMPONENTS:
        ds = daemonset(off, suffix)
        c = container(ds, name)
        if c.get("ports") or variable in env_of(c):
            fail(f"metrics: metrics.enabled=false still rendered the {name} port or address")
        if ds["spec"]["template"]["metadata"].get("annotations"):
            fail(f"metrics: metrics.enabled=false still rendered {name} scrape annotations")
    print("helm template (metrics): ports, scrape annotations and Services by default for the "
          "scheduler and the device plugin; ServiceMonitors when enabled; an explicit address "
          "wins; nothing when off")


def check_overrides(checker, helm_path, root):
    overrides = {
        "devicePlugin.slotsPerGpu": "4",
        "devicePlugin.failRequestsGreaterThanOne": "true",
        "devicePlugin.deviceListStrategy": "envvar",
        "devicePlugin.socketDir": "/run/gpu-share",
        "scheduler.socket": "/run/gpu-share/scheduler.sock",
        "scheduler.mode": "exclusive",
        "scheduler.quantumMax": "20",
    }
    docs = render(checker, helm_path, root, overrides, "overrides")
    scheduler = daemonset(docs, "-scheduler")
    plugin = daemonset(docs, "-device-plugin")
    plugin_env = env_of(container(plugin, "device-plugin"))
    scheduler_env = env_of(container(scheduler, "scheduler"))
    expect = [(plugin_env, "NVSHARE_PLUGIN_SLOTS_PER_GPU", "4"),
              (plugin_env, "NVSHARE_PLUGIN_FAIL_REQUESTS_GREATER_THAN_ONE", "true"),
              (plugin_env, "NVSHARE_PLUGIN_SOCKET_DIR", "/run/gpu-share"),
              (plugin_env, "NVSHARE_PLUGIN_DEVICE_LIST_STRATEGY", "envvar"),
              (scheduler_env, "NVSHARE_SOCKET", "/run/gpu-share/scheduler.sock"),
              (scheduler_env, "NVSHARE_MODE", "exclusive"),
              (scheduler_env, "NVSHARE_QUANTUM_MAX", "20")]
    for env, name, value in expect:
        if env.get(name) != value:
            fail(f"overrides: {name} is {env.get(name)!r}, expected {value!r}")
    for ds, label in ((scheduler, "scheduler"), (plugin, "device plugin")):
        paths = set(host_paths(ds).values())
        if "/var/run/nvshare" in paths:
            fail(f"overrides: the {label} still mounts /var/run/nvshare after socketDir moved")
    if "/var/run/cdi" in host_paths(plugin).values():
        fail("overrides: the plugin mounts the CDI spec directory though it writes no CDI spec (envvar)")
    if "/run/gpu-share" not in host_paths(scheduler).values():
        fail("overrides: the scheduler does not mount the moved socket directory /run/gpu-share")
    print("helm template (overrides): every value reached its variable")


def pod_security_context(ds):
    return (ds or {}).get("spec", {}).get("template", {}).get("spec", {}).get("securityContext", {})


def check_cluster_fit(checker, helm_path, root):
    """GKE's quota for the priority class, OpenShift's SCC, SELinux's type: off by default, right when on."""
    overrides = {"priorityClassQuota.create": "true", "openshift.scc.create": "true",
                 "seLinuxType": "spc_t", "namespace.labelPodSecurity": "true",
                 "gpuOperator.enabled": "true"}
    done = helm(helm_path, root, ["lint", "--strict", CHART, *sets(overrides)])
    if done.returncode != 0:
        fail(f"helm lint --strict (cluster fit) failed:\n{done.stdout}{done.stderr}")
    docs = render(checker, helm_path, root, overrides, "cluster fit")
    kinds = by_kind(docs)
    quotas = kinds.get("ResourceQuota", [])
    if len(quotas) != 1:
        fail(f"cluster fit: {len(quotas)} ResourceQuota objects, expected 1")
    else:
        quota = quotas[0]
        expressions = quota["spec"].get("scopeSelector", {}).get("matchExpressions", [])
        if quota["metadata"].get("namespace") != NAMESPACE or expressions != [
                {"operator": "In", "scopeName": "PriorityClass", "values": ["system-node-critical"]}]:
            fail(f"cluster fit: the quota does not name the pods' priority class in {NAMESPACE}: {quota}")
    sccs = kinds.get("SecurityContextConstraints", [])
    if len(sccs) != 1:
        fail(f"cluster fit: {len(sccs)} SecurityContextConstraints, expected 1")
    else:
        scc = sccs[0]
        plugin = daemonset(docs, "-device-plugin")
        plugin_sa = plugin["spec"]["template"]["spec"].get("serviceAccountName") if plugin else None
        want_users = {f"system:serviceaccount:{NAMESPACE}:{plugin_sa}",
                      f"system:serviceaccount:{NAMESPACE}:default"}
        if set(scc.get("users", [])) != want_users:
            fail(f"cluster fit: SCC users {scc.get('users')}, expected {sorted(want_users)}")
        for key, value in (("allowHostPID", True), ("allowHostDirVolumePlugin", True),
                           ("allowPrivilegedContainer", False), ("allowHostNetwork", False),
                           ("allowPrivilegeEscalation", False)):
            if scc.get(key) != value:
                fail(f"cluster fit: SCC {key} is {scc.get(key)!r}, expected {value!r}")
    namespaces = kinds.get("Namespace", [])
    want_labels = {f"pod-security.kubernetes.io/{mode}": "privileged"
                   for mode in ("enforce", "audit", "warn")}
    if len(namespaces) != 1 or namespaces[0]["metadata"].get("name") != NAMESPACE:
        fail(f"cluster fit: expected the Namespace {NAMESPACE}, got {namespaces}")
    else:
        labels = namespaces[0]["metadata"].get("labels", {})
        if any(labels.get(k) != v for k, v in want_labels.items()):
            fail(f"cluster fit: the namespace's Pod Security labels are {labels}")
        if namespaces[0]["metadata"].get("annotations", {}).get("helm.sh/resource-policy") != "keep":
            fail("cluster fit: an uninstall would delete the namespace")
    for suffix in ("-scheduler", "-device-plugin"):
        spec = (daemonset(docs, suffix) or {}).get("spec", {}).get("template", {}).get("spec", {})
        selector = spec.get("nodeSelector", {})
        if selector.get("nvidia.com/gpu.deploy.device-plugin") != "false" or \
                selector.get("nvshare.com/enabled") != "true":
            fail(f"cluster fit: beside the GPU Operator the *{suffix} pods select {selector}")
        want_class = "nvidia" if suffix == "-device-plugin" else None
        if spec.get("runtimeClassName") != want_class:
            fail(f"cluster fit: the *{suffix} pods' runtimeClassName is {spec.get('runtimeClassName')!r}")
    for suffix in ("-scheduler", "-device-plugin"):
        context = pod_security_context(daemonset(docs, suffix))
        if context.get("seLinuxOptions", {}).get("type") != "spc_t":
            fail(f"cluster fit: the *{suffix} pods have no seLinuxOptions type spc_t: {context}")
    defaults = by_kind(render(checker, helm_path, root, {}, "defaults (cluster fit)"))
    for kind in ("ResourceQuota", "SecurityContextConstraints", "Namespace"):
        if kind in defaults:
            fail(f"cluster fit: the defaults render a {kind}")
    for doc in defaults.get("DaemonSet", []):
        if "seLinuxOptions" in pod_security_context(doc):
            fail(f"cluster fit: the defaults set an SELinux type on {doc['metadata']['name']}")
        spec = doc["spec"]["template"]["spec"]
        if "runtimeClassName" in spec or "nvidia.com/gpu.deploy.device-plugin" in spec.get("nodeSelector", {}):
            fail(f"cluster fit: the defaults assume the GPU Operator on {doc['metadata']['name']}")
    print("helm template (cluster fit): Pod Security labels, quota, SCC, SELinux type and the GPU "
          "Operator's node label rendered when asked for, not otherwise")


def check_refusals(helm_path, root):
    """Settings that would crash-loop or reach too far: refused by `helm template` (and `helm
    lint`), each with a message naming what is wrong."""
    cases = [
        ({"devicePlugin.controlSocket": "/run/other/control.sock"}, "must be the same socket", []),
        ({"devicePlugin.controlSocket": "/var/run/nvshare/control.sock",
          "scheduler.controlSocket": "/var/run/nvshare/control.sock"}, "must lie outside", []),
        ({"scheduler.socket": "/tmp/elsewhere.sock"}, "scheduler.socket", []),
        ({"image.repository": None}, "image.repository is required", []),
        ({"devicePlugin.deviceListStrategy": "foo"}, "deviceListStrategy", []),
        ({"devicePlugin.slotsPerGpu": "0"}, "slotsPerGpu", []),
        ({"devicePlugin.slotPerGpu": "4"}, "slotPerGpu", []),
        ({"scheduler.mode": "fast"}, "mode", []),
        ({"devicePlugin.injection": "preload"}, "injection", []),
        ({"metrics.port": "http"}, "port", []),
        ({}, "slotsPerGpu", ["devicePlugin.slotsPerGpu=1001"]),
        ({}, "needs Kubernetes 1.31 or later, and this cluster is v1.28", ["--kube-version", "1.28.0"]),
        ({"devicePlugin.deviceListStrategy": "envvar\\,cdi-cri"}, "needs Kubernetes 1.31",
         ["--kube-version", "1.30.4"]),
        ({"devicePlugin.injection": "ld-so-preload",
          "devicePlugin.ldSoPreloadHostPath": "/var/lib/nvshare/ld.so.preload"},
         "mounted writable into the device plugin, holds", []),
        ({"devicePlugin.injection": "ld-so-preload",
          "devicePlugin.ldSoPreloadHostPath": "/var/lib/nvshare/lib/ld.so.preload"},
         "holds the library", []),
    ]
    for overrides, message, extra in cases:
        typed = [] if not extra or extra[0].startswith("--") else ["--set", extra[0]]
        flags = extra if extra and extra[0].startswith("--") else []
        done = helm(helm_path, root, ["template", "rel", CHART, *sets(overrides), *typed, *flags])
        label = f"{overrides} {extra}".strip()
        if done.returncode == 0:
            fail(f"refusals: {label} rendered; the chart must refuse it")
        elif message not in done.stderr:
            fail(f"refusals: {label} failed without saying {message!r}: {done.stderr.strip()}")
    # What the gate and the checks must still let through.
    for overrides, flags in (({"devicePlugin.deviceListStrategy": "envvar"}, ["--kube-version", "1.28.0"]),
                             ({}, ["--kube-version", "1.31.0"]),
                             ({"devicePlugin.slotsPerGpu": "1000"}, [])):
        done = helm(helm_path, root, ["template", "rel", CHART, *sets(overrides), *flags])
        if done.returncode != 0:
            fail(f"refusals: {overrides} {flags} was refused: {done.stderr.strip()}")
    print(f"helm template refused {len(cases)} settings that would crash-loop or reach too far, "
          "each with its reason")


def check_ld_so_preload(checker, helm_path, root):
    """ld-so-preload mode mounts the preload file's own directory writable into the plugin, and
    nothing above it; every other host directory of the plugin's stays as it was."""
    docs = render(checker, helm_path, root, {"devicePlugin.injection": "ld-so-preload"}, "ld-so-preload")
    plugin = daemonset(docs, "-device-plugin")
    mounts = mounts_by_host_path(plugin)
    preload = mounts.get("/var/lib/nvshare/preload")
    if preload != [("device-plugin", "/var/lib/nvshare/preload", False)]:
        fail(f"ld-so-preload: the preload directory is mounted as {preload}")
    for path in mounts:
        if path in ("/var/lib/nvshare", "/var/lib", "/"):
            fail(f"ld-so-preload: the plugin mounts {path}, which holds the scheduler's state")
    library = mounts.get("/var/lib/nvshare/lib", [])
    if ("device-plugin", "/var/lib/nvshare/lib", True) not in library:
        fail(f"ld-so-preload: the plugin's library mount is {library}, expected read-only")
    print("helm template (ld-so-preload): the preload file's own directory only")


def main(argv):
    root = os.path.abspath(argv[1] if len(argv) > 1 else ".")
    helm_path = argv[2] if len(argv) > 2 else "helm"
    MODELS["dir"] = argv[3] if len(argv) > 3 else None
    version = helm(helm_path, root, ["version", "--short"])
    print(f"helm {version.stdout.strip()}")
    checker = load_checker(root)
    check_lint(helm_path, root)
    check_defaults(checker, helm_path, root)
    check_overrides(checker, helm_path, root)
    check_metrics(checker, helm_path, root)
    check_cluster_fit(checker, helm_path, root)
    check_refusals(helm_path, root)
    check_ld_so_preload(checker, helm_path, root)
    if MODELS["dir"]:
        # The validator itself: an object the schemas refuse must be refused.
        before = len(FAILURES)
        validate(root, [{"apiVersion": "v1", "kind": "Service", "metadata": {"name": "bad"},
                         "spec": {"ports": [{"port": "metrics"}]}}], "known bad")
        if len(FAILURES) == before:
            fail("kubernetes-models: a Service with a port named instead of numbered passed")
        else:
            del FAILURES[before:]
        print(f"kubernetes-models: {MODELS['checked']} rendered objects valid against the "
              f"Kubernetes OpenAPI schemas (not in them: {sorted(MODELS['skipped'])})")
        if MODELS["checked"] == 0:
            fail("kubernetes-models: no rendered object was validated")
    for message in FAILURES:
        print(f"FAIL: {message}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
