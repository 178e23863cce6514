#!/usr/bin/env python3
"""Checks the Grafana dashboard against what the scheduler exports.

  check_dashboard.py REPOSITORY_ROOT NVSHARE_SCHEDULER PROMTOOL

  - deploy/grafana/nvshare-dashboard.json loads, and every panel has a title, a description and
    queries;
  - every metric a query or a template variable names is a family a real nvshare-scheduler exports
    (read from its own GET /metrics: the `# TYPE` lines; histograms with their _bucket, _sum and
    _count series);
  - every query is valid PromQL (`promtool check rules` on the queries as recording rules, with the
    dashboard's variables filled in);
  - docs/metrics.md describes every panel (by its title).

Exit status 0 when everything holds, 1 otherwise (each failure is printed).
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request

FAILURES = []


def fail(message):
    FAILURES.append(message)


def exported_families(scheduler):
    """{name: type} from a real scheduler's exposition."""
    with tempfile.TemporaryDirectory() as tmp:
        log_path = os.path.join(tmp, "scheduler.log")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [scheduler, "--socket", os.path.join(tmp, "s.sock"),
                 "--control-socket", os.path.join(tmp, "c.sock"), "--state-file", "",
                 "--gpus", "GPU-dashboard-0=16Gi", "--metrics-address", "127.0.0.1:0"],
                stdout=log, stderr=subprocess.STDOUT)
        try:
            url = None
            for _ in range(100):
                found = re.search(r"metrics on (http://\S+/metrics)", open(log_path).read())
                if found:
                    url = found.group(1)
                    break
                time.sleep(0.05)
            if url is None:
                fail(f"the scheduler never said where its metrics are: {open(log_path).read()}")
                return {}
            text = urllib.request.urlopen(url, timeout=10).read().decode()
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    return dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.MULTILINE))


def series_names(families):
    names = set()
    for name, kind in families.items():
        names.add(name)
        if kind == "histogram":
            names.update({name + "_bucket", name + "_sum", name + "_count"})
    return names


def filled(expr):
    """The query with the dashboard's variables given values promtool accepts."""
    expr = expr.replace("$__rate_interval", "5m")
    return re.sub(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?", ".*", expr)


def main(argv):
    root, scheduler, promtool = argv[1], argv[2], argv[3]
    dashboard_path = os.path.join(root, "deploy/grafana/nvshare-dashboard.json")
    try:
        dashboard = json.load(open(dashboard_path))
    except (OSError, ValueError) as error:
        print(f"FAIL: {dashboard_path}: {error}")
        return 1
    exported = series_names(exported_families(scheduler))
    if not exported:
        fail("the scheduler exported no metric families")

    queries = []  # (where, expr)
    for panel in dashboard.get("panels", []):
        title = panel.get("title", "")
        if not title or not panel.get("description"):
            fail(f"panel {panel.get('id')}: needs a title and a description")
        targets = panel.get("targets", [])
        if not targets:
            fail(f"panel {title!r}: no queries")
        for target in targets:
            queries.append((f"panel {title!r}", target.get("expr", "")))
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") == "query":
            queries.append((f"variable {variable.get('name')!r}", variable.get("query", "")))

    for where, expr in queries:
        names = set(re.findall(r"\bnvshare_[a-z0-9_]+", expr))
        if not names:
            fail(f"{where}: {expr!r} names no nvshare metric")
        for name in sorted(names - exported):
            fail(f"{where}: {name} is not exported by nvshare-scheduler")

    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query_{i}", "expr": filled(expr)}
        for i, (where, expr) in enumerate(queries) if where.startswith("panel")]}]}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as handle:
        json.dump(rules, handle)  # JSON is YAML
        rules_path = handle.name
    try:
        done = subprocess.run([promtool, "check", "rules", rules_path], capture_output=True,
                              text=True, timeout=60)
        if done.returncode != 0:
            fail(f"promtool check rules: {done.stdout}{done.stderr}")
    finally:
        os.unlink(rules_path)

    docs = open(os.path.join(root, "docs/metrics.md")).read()
    for panel in dashboard.get("panels", []):
        if panel.get("title") and panel["title"] not in docs:
            fail(f"docs/metrics.md does not describe the panel {panel['title']!r}")

    for message in FAILURES:
        print(f"FAIL: {message}")
    print(f"check_dashboard: {len(dashboard.get('panels', []))} panels, {len(queries)} queries "
          f"against {len(exported)} exported series names; {len(FAILURES)} failure(s)")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
