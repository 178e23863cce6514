#!/usr/bin/env python3
"""Checks that the deployment files agree with the programs they deploy.

  check_chart.py REPOSITORY_ROOT NVSHARE_SCHEDULER NVSHARE_DEVICE_PLUGIN

Reads the two knob tables from the programs themselves (`--print-knobs`: every knob's name, flag,
variable and default as JSON, from the one table each program parses with) and checks:

  - values.yaml has, for every knob, an empty value at scheduler.<camelCase> or
    devicePlugin.<camelCase>, documented by a comment naming its variable, flag and default;
  - the chart's knob tables (templates/_helpers.tpl) map every knob, and only knobs, to its
    environment variable, and the DaemonSet templates emit them;
  - the host paths the chart falls back to are the programs' defaults;
  - the templates are well formed as far as can be told without Helm (balanced blocks, defined
    includes, .Values paths that exist in values.yaml);
  - the plain manifests are YAML, hold the expected objects with least-privilege RBAC and the
    documented security settings, and agree with the chart's defaults;
  - the example workload requests the resource with valid annotations;
  - the Dockerfile builds and copies targets that exist.

Standard library only. PyYAML is used when installed (and then also proves the fallback parser);
without it a small parser for the YAML subset these files use does the structural checks.
Exit status 0 when everything holds, 1 otherwise (each failure is printed).
"""

import json
import os
import re
import subprocess
import sys

FAILURES = []


def fail(message):
    FAILURES.append(message)


def read(root, path):
    with open(os.path.join(root, path), encoding="utf-8") as handle:
        return handle.read()


# ---- knob tables -------------------------------------------------------------------------------

def program_knobs(binary):
    """[(name, default)] of a program's knob table, as it prints it (--print-knobs)."""
    try:
        output = subprocess.run([binary, "--print-knobs"], check=True, capture_output=True,
                                text=True, timeout=60).stdout
        knobs = [(k["name"], k["default"]) for k in json.loads(output)]
    except (OSError, subprocess.SubprocessError, ValueError, KeyError, TypeError) as error:
        fail(f"{binary} --print-knobs: {error}")
        return []
    if not knobs:
        fail(f"{binary} --print-knobs: no knobs")
    return knobs


def camel(name):
    head, *rest = name.split("-")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def env_name(prefix, name):
    return prefix + name.upper().replace("-", "_")


def doc_table_knobs(root, env_prefix, exclude_prefix=None):
    """Knob names of docs/configuration.md table rows whose variable starts with env_prefix."""
    names = []
    for line in read(root, "docs/configuration.md").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        flags = [c for c in cells if c.startswith("`--")]
        variables = [c.strip("`") for c in cells if c.startswith("`NVSHARE_")]
        if not flags or not variables:
            continue
        variable = variables[0]
        if variable.startswith(env_prefix) and not (
                exclude_prefix and variable.startswith(exclude_prefix)):
            names.append(cells[0])
    return names


# ---- a parser for the YAML subset of these files -------------------------------------------------

class YamlSubsetError(Exception):
    pass


def strip_comment(line):
    quote = None
    for index, char in enumerate(line):
        if quote:
            if char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char == "#" and (index == 0 or line[index - 1] in " \t"):
            return line[:index].rstrip()
    return line.rstrip()


def parse_scalar(text):
    text = text.strip()
    if text.startswith('"'):
        if not text.endswith('"') or len(text) < 2:
            raise YamlSubsetError(f"unterminated string {text}")
        return json.loads(text)
    if text.startswith("'"):
        if not text.endswith("'") or len(text) < 2:
            raise YamlSubsetError(f"unterminated string {text}")
        return text[1:-1].replace("''", "'")
    if text.startswith("["):
        if not text.endswith("]"):
            raise YamlSubsetError(f"unterminated flow sequence {text}")
        inner = text[1:-1].strip()
        return [parse_scalar(item) for item in split_flow(inner)] if inner else []
    if text.startswith("{"):
        if text.replace(" ", "") != "{}":
            raise YamlSubsetError(f"flow mappings other than {{}} are not in the subset: {text}")
        return {}
    if text in ("true", "True", "TRUE"):
        return True
    if text in ("false", "False", "FALSE"):
        return False
    if text in ("", "~", "null", "Null", "NULL"):
        return None
    if re.fullmatch(r"[-+]?[0-9]+", text):
        return int(text)
    if re.fullmatch(r"[-+]?([0-9]+\.[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?", text):
        return float(text)
    if text[0] in "&*!|>%@`":
        raise YamlSubsetError(f"YAML feature outside the subset: {text}")
    return text


def split_flow(text):
    items, current, quote = [], "", None
    for char in text:
        if quote:
            current += char
            if char == quote:
                quote = None
        elif char in "\"'":
            quote = char
            current += char
        elif char == ",":
            items.append(current)
            current = ""
        else:
            current += char
    items.append(current)
    return [item.strip() for item in items]


def split_key(content):
    """(key, rest) when content is `key: rest` or `key:`, else None."""
    quote = None
    for index, char in enumerate(content):
        if quote:
            if char == quote:
                quote = None
        elif char in "\"'" and index == 0:
            quote = char
        elif char == ":" and (index + 1 == len(content) or content[index + 1] == " "):
            key = content[:index].strip()
            if key.startswith(("'", '"')):
                key = parse_scalar(key)
            return key, content[index + 1:].strip()
    return None


def parse_yaml_subset(text):
    """All documents of a YAML text written in block style (maps, sequences, plain and quoted
    scalars, flow sequences of scalars, {} and [])."""
    documents, current = [], []
    for raw in text.splitlines():
        if raw.rstrip() == "---":
            documents.append(current)
            current = []
            continue
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise YamlSubsetError("tab in indentation")
        line = strip_comment(raw)
        if line.strip():
            current.append([len(line) - len(line.lstrip()), line.strip()])
    documents.append(current)
    return [parse_document(lines) for lines in documents if lines]


def parse_document(lines):
    value, index = parse_block(lines, 0, lines[0][0])
    if index != len(lines):
        raise YamlSubsetError(f"unexpected indentation at {lines[index][1]!r}")
    return value


def parse_block(lines, index, indent):
    if lines[index][1].startswith("- ") or lines[index][1] == "-":
        return parse_sequence(lines, index, indent)
    return parse_mapping(lines, index, indent)


def parse_mapping(lines, index, indent):
    mapping = {}
    while index < len(lines) and lines[index][0] == indent:
        content = lines[index][1]
        if content.startswith("- ") or content == "-":
            break
        pair = split_key(content)
        if pair is None:
            raise YamlSubsetError(f"expected `key: value`, got {content!r}")
        key, rest = pair
        if key in mapping:
            raise YamlSubsetError(f"duplicate key {key!r}")
        index += 1
        if rest in ("|", "|-", ">", ">-"):
            mapping[key], index = block_scalar(lines, index, indent, rest)
        elif rest:
            mapping[key] = parse_scalar(rest)
        elif index < len(lines) and (lines[index][0] > indent or (
                lines[index][0] == indent and lines[index][1].startswith("-"))):
            mapping[key], index = parse_block(lines, index, lines[index][0])
        else:
            mapping[key] = None
    if index < len(lines) and lines[index][0] > indent:
        raise YamlSubsetError(f"unexpected indentation at {lines[index][1]!r}")
    return mapping, index


def block_scalar(lines, index, indent, style):
    """A literal (|) or folded (>) scalar of lines indented past `indent`, one level deep."""
    block = []
    while index < len(lines) and lines[index][0] > indent:
        block.append(lines[index][1])
        index += 1
    text = ("\n" if style.startswith("|") else " ").join(block)
    return (text if style.endswith("-") else text + "\n"), index


def parse_sequence(lines, index, indent):
    sequence = []
    while index < len(lines) and lines[index][0] == indent and (
            lines[index][1].startswith("- ") or lines[index][1] == "-"):
        rest = lines[index][1][1:].strip()
        if rest in ("|", "|-", ">", ">-"):
            value, index = block_scalar(lines, index + 1, indent, rest)
            sequence.append(value)
        elif not rest:
            index += 1
            value, index = parse_block(lines, index, lines[index][0])
            sequence.append(value)
        elif split_key(rest) is not None and not rest.startswith(("[", "{")):
            # `- key: value` opens a mapping whose keys sit where `key` does.
            offset = len(lines[index][1]) - len(rest)
            lines[index] = [indent + offset, rest]
            value, index = parse_mapping(lines, index, indent + offset)
            sequence.append(value)
        else:
            sequence.append(parse_scalar(rest))
            index += 1
    return sequence, index


def load_yaml(path_label, text):
    """Documents of a YAML text; None (and a failure) when it does not parse."""
    try:
        subset = parse_yaml_subset(text)
    except YamlSubsetError as error:
        fail(f"{path_label}: not valid YAML (subset parser): {error}")
        subset = None
    try:
        import yaml  # noqa: PLC0415 (optional)
    except ImportError:
        return subset
    try:
        full = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as error:
        fail(f"{path_label}: not valid YAML: {error}")
        return None
    if subset is not None and subset != full:
        fail(f"{path_label}: the subset parser and PyYAML disagree (fix the parser or the file)")
    return full


# ---- the checks ----------------------------------------------------------------------------------

CHART = "deploy/helm/nvshare"


def check_values(root, values, values_text, section, knobs, env_prefix):
    entries = values.get(section)
    if not isinstance(entries, dict):
        fail(f"values.yaml: no `{section}:` section")
        return
    comments = values_comments(values_text, section)
    for name, default in knobs:
        key = camel(name)
        where = f"values.yaml {section}.{key}"
        if key not in entries:
            fail(f"{where}: missing (knob {name})")
            continue
        if entries[key] not in ("", None):
            fail(f"{where}: default must be empty so the program's own default applies, "
                 f"is {entries[key]!r}")
        comment = comments.get(key, "")
        variable = env_name(env_prefix, name)
        if variable not in comment.split():
            fail(f"{where}: its comment does not name {variable}")
        if f"(--{name})" not in comment:
            fail(f"{where}: its comment does not name --{name}")
        match = re.search(r"default (\S+)", comment)
        stated = match.group(1).rstrip(".,:;") if match else None
        expected = default if default else "empty"
        if stated != expected:
            fail(f"{where}: its comment says default {stated!r}, the program's is {expected!r}")


def check_schema(root, values, scheduler_knobs, plugin_knobs):
    """values.schema.json names every key of values.yaml (it refuses unknown ones, so a key it
    lacked could never be set) and every knob of both programs, and nothing else."""
    try:
        schema = json.loads(read(root, f"{CHART}/values.schema.json"))
    except ValueError as e:
        fail(f"values.schema.json: not JSON: {e}")
        return

    def walk(node, value, where):
        if not isinstance(value, dict) or node.get("type") != "object" or "properties" not in node:
            return
        props = node["properties"]
        if node.get("additionalProperties") is not False:
            fail(f"values.schema.json {where or '(root)'}: unknown keys are not refused")
        for key in value:
            if key not in props:
                fail(f"values.schema.json {where or '(root)'}: values.yaml's {key!r} is not in the schema")
            else:
                walk(props[key], value[key], f"{where}.{key}" if where else key)

    walk(schema, values, "")
    for section, knobs in (("scheduler", scheduler_knobs), ("devicePlugin", plugin_knobs)):
        props = schema.get("properties", {}).get(section, {}).get("properties", {})
        extra = set(values.get(section, {})) - {camel(n) for n, _ in knobs}
        want = {camel(n) for n, _ in knobs} | extra
        if set(props) != want:
            fail(f"values.schema.json {section}: lists {sorted(set(props) - want)} beyond, and lacks "
                 f"{sorted(want - set(props))}")


def values_comments(values_text, section):
    """{key: the comment block just above `  key:`} within a top-level section."""
    comments, current_section, block = {}, None, []
    for line in values_text.splitlines():
        if line and not line.startswith((" ", "#")):
            current_section = line.split(":")[0]
            block = []
            continue
        if current_section != section:
            continue
        stripped = line.strip()
        if stripped.startswith("#"):
            block.append(stripped.lstrip("#").strip())
        elif re.match(r"^  [A-Za-z]\w*:", line):
            comments[stripped.split(":")[0]] = " ".join(block)
            block = []
        else:
            block = []
    return comments


def helper_defines(helpers):
    return dict(re.findall(r'\{\{-?\s*define\s+"([^"]+)"\s*-?\}\}(.*?)\{\{-?\s*end\s*-?\}\}',
                           helpers, re.DOTALL))


def check_chart_tables(helpers, define, knobs, env_prefix):
    body = helper_defines(helpers).get(define)
    if body is None:
        fail(f"_helpers.tpl: no define {define}")
        return
    table = {}
    for line in body.strip().splitlines():
        key, _, env = line.partition(":")
        if key.strip() in table:
            fail(f"_helpers.tpl {define}: {key.strip()} listed twice")
        table[key.strip()] = env.strip()
    expected = {camel(name): env_name(env_prefix, name) for name, _ in knobs}
    for key, env in expected.items():
        if key not in table:
            fail(f"_helpers.tpl {define}: knob value {key} ({env}) is missing")
        elif table[key] != env:
            fail(f"_helpers.tpl {define}: {key} maps to {table[key]}, must be {env}")
    for key in table.keys() - expected.keys():
        fail(f"_helpers.tpl {define}: {key} is not a knob")


def check_path_fallbacks(helpers, knobs_by_section):
    """`.Values.<section>.<key> | default "<literal>"` must use the program's default."""
    seen = 0
    for section, key, literal in re.findall(
            r'\.Values\.(scheduler|devicePlugin)\.(\w+)\s*\|\s*default\s*"([^"]*)"', helpers):
        seen += 1
        defaults = {camel(n): d for n, d in knobs_by_section[section]}
        if key not in defaults:
            fail(f"_helpers.tpl: falls back for {section}.{key}, which is not a knob")
        elif defaults[key] != literal:
            fail(f"_helpers.tpl: {section}.{key} falls back to {literal!r}, "
                 f"the program's default is {defaults[key]!r}")
    if seen == 0:
        fail("_helpers.tpl: no host-path fallbacks found")


BLOCK_OPENERS = ("if", "range", "with", "define", "block")


def check_template_syntax(name, text, defined, values):
    depth = 0
    for action in re.findall(r"\{\{(.*?)\}\}", text, re.DOTALL):
        body = action.strip().lstrip("-").rstrip("-").strip()
        if body.startswith("/*"):
            continue
        word = re.split(r"[\s(]", body, maxsplit=1)[0]
        if word in BLOCK_OPENERS:
            depth += 1
        elif word == "end":
            depth -= 1
            if depth < 0:
                fail(f"{name}: `end` without an open block")
                depth = 0
    if depth != 0:
        fail(f"{name}: {depth} block(s) left open")
    if text.count("{{") != text.count("}}"):
        fail(f"{name}: unbalanced {{{{ and }}}}")
    for include in re.findall(r'(?:include|template)\s+"([^"]+)"', text):
        if include not in defined:
            fail(f"{name}: includes undefined template {include!r}")
    for path in re.findall(r"\.Values((?:\.\w+)+)", text):
        node = values
        for part in path.strip(".").split("."):
            if not isinstance(node, dict) or part not in node:
                fail(f"{name}: .Values{path} is not in values.yaml")
                break
            node = node[part]


def check_templates(root, values, scheduler_knobs, plugin_knobs):
    templates_dir = os.path.join(root, CHART, "templates")
    texts = {}
    for entry in sorted(os.listdir(templates_dir)):
        texts[entry] = read(root, f"{CHART}/templates/{entry}")
    helpers = texts.get("_helpers.tpl", "")
    defined = set(helper_defines(helpers))
    for entry, text in texts.items():
        check_template_syntax(f"templates/{entry}", text, defined, values)
    check_chart_tables(helpers, "nvshare.schedulerKnobs", scheduler_knobs, "NVSHARE_")
    check_chart_tables(helpers, "nvshare.devicePluginKnobs", plugin_knobs, "NVSHARE_PLUGIN_")
    check_path_fallbacks(helpers, {"scheduler": scheduler_knobs, "devicePlugin": plugin_knobs})
    for entry, section, table in (("scheduler.yaml", "scheduler", "nvshare.schedulerKnobs"),
                                  ("device-plugin.yaml", "devicePlugin",
                                   "nvshare.devicePluginKnobs")):
        text = texts.get(entry, "")
        if not re.search(r'include "nvshare\.knobEnv" \(list \.Values\.' + section +
                         r' \(include "' + re.escape(table) + r'" \.\)\)', text):
            fail(f"templates/{entry}: does not emit the {section} knobs (nvshare.knobEnv)")
    plugin = texts.get("device-plugin.yaml", "")
    for needle, why in (("fieldPath: spec.nodeName", "NODE_NAME from the downward API"),
                        ("name: NODE_NAME", "NODE_NAME"),
                        ("nvshare-install-library", "the library installer"),
                        ("serviceAccountName:", "the service account")):
        if needle not in plugin:
            fail(f"templates/device-plugin.yaml: missing {why} ({needle})")
    if "hostPID" in plugin:
        fail("templates/device-plugin.yaml: the plugin must not share the host's pid namespace")
    # The control socket admits root: its directory reaches the scheduler and, read-only, the
    # plugin; the socket directory (which GPU containers get) never holds it.
    if not re.search(r"- name: control-dir\n\s+mountPath: [^\n]+\n\s+readOnly: true", plugin):
        fail("templates/device-plugin.yaml: the control directory must be mounted read-only")
    if "socket-dir" in plugin:
        fail("templates/device-plugin.yaml: the plugin needs no mount of the socket directory")
    if not re.search(r'hasPrefix \(printf "%s/" \$dir\) \(clean \$control\)', helpers):
        fail("_helpers.tpl nvshare.checkSockets: must refuse a control socket inside socketDir")
    scheduler = texts.get("scheduler.yaml", "")
    for needle in ("hostPID: true", "automountServiceAccountToken: false"):
        if needle not in scheduler:
            fail(f"templates/scheduler.yaml: missing `{needle}`")
    rbac = texts.get("rbac.yaml", "")
    verbs = re.findall(r"resources:\s*\[([^\]]*)\]\s*\n\s*verbs:\s*\[([^\]]*)\]", rbac)
    granted = {(r.strip().strip('"'), v.strip().strip('"'))
               for res, vs in verbs for r in res.split(",") for v in vs.split(",")}
    if granted != EXPECTED_GRANTS:
        fail(f"templates/rbac.yaml: grants {sorted(granted)}, expected {sorted(EXPECTED_GRANTS)}")
    if "NOTES.txt" not in texts:
        fail("templates/NOTES.txt is missing")


EXPECTED_GRANTS = {("pods", "get"), ("pods", "list"), ("pods", "watch"), ("events", "create")}


def containers_of(pod_spec):
    return (pod_spec.get("initContainers") or []) + (pod_spec.get("containers") or [])


def check_manifests(root, values, chart, scheduler_knobs, plugin_knobs):
    label = "deploy/manifests/nvshare.yaml"
    documents = load_yaml(label, read(root, label))
    if documents is None:
        return
    by_kind = {}
    for document in documents:
        if not isinstance(document, dict) or "kind" not in document:
            fail(f"{label}: a document without kind")
            continue
        by_kind.setdefault(document["kind"], []).append(document)
    namespace = "nvshare-system"
    expected_kinds = {"Namespace": 1, "ServiceAccount": 1, "ClusterRole": 1,
                      "ClusterRoleBinding": 1, "DaemonSet": 2, "Service": 2}
    for kind, count in expected_kinds.items():
        if len(by_kind.get(kind, [])) != count:
            fail(f"{label}: expected {count} {kind}, found {len(by_kind.get(kind, []))}")
    for kind in by_kind.keys() - expected_kinds.keys():
        fail(f"{label}: unexpected {kind}")
    if FAILURES and any(f.startswith(label) for f in FAILURES):
        return

    ns = by_kind["Namespace"][0]
    if ns["metadata"]["name"] != namespace:
        fail(f"{label}: namespace is {ns['metadata']['name']}, expected {namespace}")
    account = by_kind["ServiceAccount"][0]["metadata"]
    if account.get("namespace") != namespace:
        fail(f"{label}: the ServiceAccount is not in {namespace}")
    role = by_kind["ClusterRole"][0]
    granted = set()
    for rule in role.get("rules", []):
        if rule.get("apiGroups") != [""]:
            fail(f"{label}: ClusterRole rule outside the core API group: {rule}")
        for resource in rule.get("resources", []):
            for verb in rule.get("verbs", []):
                granted.add((resource, verb))
    if granted != EXPECTED_GRANTS:
        fail(f"{label}: ClusterRole grants {sorted(granted)}, expected {sorted(EXPECTED_GRANTS)}")
    binding = by_kind["ClusterRoleBinding"][0]
    if binding["roleRef"]["name"] != role["metadata"]["name"]:
        fail(f"{label}: the binding names another role")
    if binding["subjects"] != [{"kind": "ServiceAccount", "name": account["name"],
                                "namespace": namespace}]:
        fail(f"{label}: the binding's subject is not the plugin's service account")

    daemonsets = {ds["metadata"]["name"]: ds for ds in by_kind["DaemonSet"]}
    scheduler = daemonsets.get("nvshare-scheduler")
    plugin = daemonsets.get("nvshare-device-plugin")
    if scheduler is None or plugin is None:
        fail(f"{label}: DaemonSets must be nvshare-scheduler and nvshare-device-plugin, "
             f"are {sorted(daemonsets)}")
        return
    knob_envs = {env_name("NVSHARE_", n) for n, _ in scheduler_knobs} | {
        env_name("NVSHARE_PLUGIN_", n) for n, _ in plugin_knobs}
    # The chart has no default repository (it must be given); the plain manifests name the image
    # nvshare:<version>, for the reader to replace with the registry's path (docs/kubernetes.md).
    image = f"nvshare:{chart['appVersion']}"
    for name, ds in daemonsets.items():
        where = f"{label} {name}"
        if ds["metadata"].get("namespace") != namespace:
            fail(f"{where}: not in {namespace}")
        spec = ds["spec"]["template"]["spec"]
        selector = ds["spec"]["selector"]["matchLabels"]
        labels = ds["spec"]["template"]["metadata"]["labels"]
        if any(labels.get(k) != v for k, v in selector.items()):
            fail(f"{where}: the selector does not match the pod labels")
        if spec.get("nodeSelector") != values["nodeSelector"]:
            fail(f"{where}: nodeSelector differs from values.yaml")
        if spec.get("tolerations") != values["tolerations"]:
            fail(f"{where}: tolerations differ from values.yaml")
        if spec.get("priorityClassName") != values["priorityClassName"]:
            fail(f"{where}: priorityClassName differs from values.yaml")
        if spec.get("hostNetwork"):
            fail(f"{where}: hostNetwork is not needed")
        for container in containers_of(spec):
            cwhere = f"{where} container {container['name']}"
            if container.get("image") != image:
                fail(f"{cwhere}: image {container.get('image')}, expected {image}")
            security = container.get("securityContext") or {}
            if security.get("privileged"):
                fail(f"{cwhere}: privileged")
            if security.get("allowPrivilegeEscalation") is not False:
                fail(f"{cwhere}: allowPrivilegeEscalation must be false")
            if security.get("readOnlyRootFilesystem") is not True:
                fail(f"{cwhere}: readOnlyRootFilesystem must be true")
            if (security.get("capabilities") or {}).get("drop") != ["ALL"]:
                fail(f"{cwhere}: must drop ALL capabilities")
            if (security.get("capabilities") or {}).get("add"):
                fail(f"{cwhere}: adds capabilities")
            if not (container.get("resources") or {}).get("requests"):
                fail(f"{cwhere}: no resource requests")
            for variable in container.get("env") or []:
                env = variable["name"]
                if env.startswith("NVSHARE_") and env not in knob_envs:
                    fail(f"{cwhere}: {env} is not a knob")

    plugin_defaults = dict(plugin_knobs)
    scheduler_defaults = dict(scheduler_knobs)
    socket_dir = plugin_defaults["socket-dir"]

    s_spec = scheduler["spec"]["template"]["spec"]
    if s_spec.get("hostPID") is not True:
        fail(f"{label} nvshare-scheduler: hostPID must be true (pod identity from /proc)")
    if s_spec.get("automountServiceAccountToken") is not False:
        fail(f"{label} nvshare-scheduler: must not mount a service-account token")
    if os.path.dirname(scheduler_defaults["socket"]) != socket_dir:
        fail(f"knob defaults: the scheduler's socket {scheduler_defaults['socket']} is not in the "
             f"plugin's socket-dir {socket_dir}")
    if s_spec["containers"][0]["resources"] != values["scheduler"]["resources"]:
        fail(f"{label} nvshare-scheduler: resources differ from values.yaml")
    control_socket = plugin_defaults["control-socket"]
    control_dir = os.path.dirname(control_socket)
    if scheduler_defaults["control-socket"] != control_socket:
        fail(f"knob defaults: the scheduler's control-socket {scheduler_defaults['control-socket']} "
             f"is not the plugin's {control_socket}")
    if (control_dir + "/").startswith(socket_dir.rstrip("/") + "/"):
        fail(f"knob defaults: the control socket {control_socket} lies in the plugin's socket-dir "
             f"{socket_dir}, which every GPU container gets")
    check_host_mounts(label + " nvshare-scheduler", s_spec,
                      {socket_dir: socket_dir, control_dir: control_dir})

    p_spec = plugin["spec"]["template"]["spec"]
    if p_spec.get("hostPID"):
        fail(f"{label} nvshare-device-plugin: must not share the host's pid namespace")
    if p_spec.get("serviceAccountName") != account["name"]:
        fail(f"{label} nvshare-device-plugin: does not run as {account['name']}")
    main = p_spec["containers"][0]
    node_name = [e for e in main.get("env", []) if e["name"] == "NODE_NAME"]
    if not node_name or node_name[0].get("valueFrom", {}).get("fieldRef", {}).get(
            "fieldPath") != "spec.nodeName":
        fail(f"{label} nvshare-device-plugin: NODE_NAME must come from spec.nodeName")
    if main["resources"] != values["devicePlugin"]["resources"]:
        fail(f"{label} nvshare-device-plugin: resources differ from values.yaml")
    library = plugin_defaults["library-host-path"]
    pod_resources_dir = os.path.dirname(plugin_defaults["pod-resources-socket"])
    check_host_mounts(label + " nvshare-device-plugin", p_spec, {
        plugin_defaults["kubelet-dir"]: plugin_defaults["kubelet-dir"],
        pod_resources_dir: pod_resources_dir,
        control_dir: control_dir,
        os.path.dirname(library): os.path.dirname(library),
    }, read_only={control_dir, os.path.dirname(library)})
    if any((v.get("hostPath") or {}).get("path") == socket_dir for v in p_spec.get("volumes", [])):
        fail(f"{label} nvshare-device-plugin: mounts the socket directory {socket_dir}, "
             f"which it does not need")
    init = (p_spec.get("initContainers") or [{}])[0]
    command = init.get("command") or []
    if len(command) != 3 or command[0] != "/usr/bin/nvshare-install-library" or \
            os.path.basename(command[2]) != os.path.basename(library):
        fail(f"{label} nvshare-device-plugin: the init container must run "
             f"nvshare-install-library SOURCE <dir>/{os.path.basename(library)}, runs {command}")
    if init.get("resources") != values["libraryInstaller"]["resources"]:
        fail(f"{label} nvshare-device-plugin: init container resources differ from values.yaml")


def check_host_mounts(where, spec, expected, read_only=frozenset()):
    """Every host directory in `expected` is a hostPath volume mounted at the expected path in the
    pod's main container, read-only when it is in `read_only`."""
    volumes = {v["name"]: v.get("hostPath", {}).get("path") for v in spec.get("volumes", [])}
    mounts = {m["name"]: m for m in spec["containers"][0].get("volumeMounts", [])}
    for host_path, container_path in expected.items():
        names = [name for name, path in volumes.items() if path == host_path]
        if not names:
            fail(f"{where}: no hostPath volume for {host_path}")
            continue
        mount = mounts.get(names[0]) or {}
        if mount.get("mountPath") != container_path:
            fail(f"{where}: {host_path} is mounted at {mount.get('mountPath')}, "
                 f"expected {container_path}")
        elif host_path in read_only and mount.get("readOnly") is not True:
            fail(f"{where}: {host_path} must be mounted read-only")


def check_examples(root, plugin_knobs):
    resource = dict(plugin_knobs).get("resource-name", "nvshare.com/gpu")
    examples = os.path.join(root, "deploy/examples")
    for entry in sorted(os.listdir(examples)):
        if not entry.endswith(".yaml"):
            continue
        label = f"deploy/examples/{entry}"
        for document in load_yaml(label, read(root, label)) or []:
            if document.get("kind") != "Pod":
                continue
            annotations = document["metadata"].get("annotations") or {}
            memory = annotations.get("nvshare.com/gpu-memory-limit")
            if memory is not None and not re.fullmatch(
                    r"\+?[0-9]+(\.[0-9]+)?([KMGTPE]i|[kMGTPE]|[eE][0-9]+)?", str(memory)):
                fail(f"{label}: gpu-memory-limit {memory!r} is not a quantity")
            core = annotations.get("nvshare.com/gpu-core-limit")
            if core is not None and (not isinstance(core, str) or
                                     not re.fullmatch(r"[0-9]+%?", core) or
                                     not 1 <= int(core.rstrip("%")) <= 100):
                fail(f"{label}: gpu-core-limit {core!r} must be a string percent 1..100")
            wants = [c for c in document["spec"]["containers"]
                     if resource in ((c.get("resources") or {}).get("limits") or {})]
            if not wants:
                fail(f"{label}: no container requests {resource}")


def check_dockerfile(root):
    text = read(root, "deploy/docker/Dockerfile")
    targets = set()
    for directory, _, files in os.walk(os.path.join(root, "src")):
        if "CMakeLists.txt" in files:
            with open(os.path.join(directory, "CMakeLists.txt"), encoding="utf-8") as handle:
                for kind, name in re.findall(r"add_(executable|library)\(\s*([\w-]+)",
                                             handle.read()):
                    targets.add((name, os.path.relpath(directory, root)))
    names = {name for name, _ in targets}
    build = re.search(r"--target ([^\n\\]+)", text)
    if not build:
        fail("Dockerfile: no `cmake --build ... --target` line")
        return
    for target in build.group(1).split():
        if target not in names:
            fail(f"Dockerfile: builds target {target}, which no src/**/CMakeLists.txt defines "
                 f"(yet)")
    outputs = {"libnvshare.so": "nvshare"}
    for path in re.findall(r"/build/(src/[\w/.-]+)", text):
        directory, file_name = os.path.split(path)
        target = outputs.get(file_name, file_name)
        if (target, directory) not in targets:
            fail(f"Dockerfile: copies /build/{path}, but {directory}/CMakeLists.txt does not "
                 f"define {target} (yet)")
    for copied in re.findall(r"install -m \d+ (deploy/[\w/.-]+)", text):
        if not os.path.exists(os.path.join(root, copied)):
            fail(f"Dockerfile: installs {copied}, which does not exist")
    if "NVSHARE_WITH_K8S=ON" not in text or "NVSHARE_BUILD_TESTS=OFF" not in text:
        fail("Dockerfile: must configure with NVSHARE_WITH_K8S=ON and NVSHARE_BUILD_TESTS=OFF")


def parse_chart_yaml(root):
    documents = load_yaml(f"{CHART}/Chart.yaml", read(root, f"{CHART}/Chart.yaml")) or [{}]
    chart = documents[0]
    for key in ("apiVersion", "name", "version", "appVersion"):
        if key not in chart:
            fail(f"Chart.yaml: no {key}")
    if chart.get("apiVersion") != "v2":
        fail("Chart.yaml: apiVersion must be v2")
    return chart


def main(argv):
    if len(argv) != 4:
        print(__doc__)
        return 2
    root = os.path.abspath(argv[1])
    scheduler_knobs = program_knobs(argv[2])
    plugin_knobs = program_knobs(argv[3])

    # docs/configuration.md lists the same scheduler knobs (and, once it has one, the plugin's).
    documented = doc_table_knobs(root, "NVSHARE_", exclude_prefix="NVSHARE_PLUGIN_")
    if sorted(documented) != sorted(n for n, _ in scheduler_knobs):
        fail(f"docs/configuration.md: scheduler table lists {sorted(documented)}, "
             f"nvshare-scheduler has {sorted(n for n, _ in scheduler_knobs)}")
    documented_plugin = doc_table_knobs(root, "NVSHARE_PLUGIN_")
    if documented_plugin and sorted(documented_plugin) != sorted(n for n, _ in plugin_knobs):
        fail(f"docs/configuration.md: device-plugin table lists {sorted(documented_plugin)}, "
             f"nvshare-device-plugin has {sorted(n for n, _ in plugin_knobs)}")

    chart = parse_chart_yaml(root)
    values_text = read(root, f"{CHART}/values.yaml")
    values = (load_yaml(f"{CHART}/values.yaml", values_text) or [None])[0]
    if not isinstance(values, dict):
        fail("values.yaml: not a mapping")
    else:
        check_values(root, values, values_text, "scheduler", scheduler_knobs, "NVSHARE_")
        check_values(root, values, values_text, "devicePlugin", plugin_knobs, "NVSHARE_PLUGIN_")
        check_templates(root, values, scheduler_knobs, plugin_knobs)
        check_schema(root, values, scheduler_knobs, plugin_knobs)
        check_manifests(root, values, chart, scheduler_knobs, plugin_knobs)
    check_examples(root, plugin_knobs)
    check_dockerfile(root)

    for failure in FAILURES:
        print(f"FAIL: {failure}")
    print(f"check_chart: {len(scheduler_knobs)} scheduler knobs, {len(plugin_knobs)} device-plugin "
          f"knobs; {len(FAILURES)} failure(s)")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
