#!/usr/bin/env python3
"""Checks the include rules of docs/architecture.md ("Dependency rules") on src/.

  check_layers.py REPOSITORY_ROOT

Each rule names a folder (or file) and the project headers its files may include; system headers
are free except where a rule forbids some. Exit status 0 when every rule holds, 1 otherwise (each
offending include is printed with its file and line).
"""

import os
import re
import sys

# folder -> the project folders (prefixes of "src/...") its files may include.
ALLOWED = {
    "src/common/": ["common/"],
    "src/control/": ["common/", "control/"],
    "src/scheduler/policy/": ["common/", "scheduler/policy/"],
    "src/client/hooks/": ["common/", "client/hooks/"],
    "src/client/cuda/": ["common/", "client/hooks/", "client/cuda/", "client/device_link.h",
                         "client/config.h", "client/settings_file.h", "client/process_events.h",
                         "client/ipc_broker_client.h", "client/host_room.h"],
    "src/client/entry/": ["common/", "client/hooks/", "client/cuda/", "client/device_link.h",
                          "client/config.h", "client/settings_file.h"],
    "src/client/link/": ["common/", "client/link/", "client/device_link.h", "client/config.h",
                         "client/settings_file.h", "client/process_events.h"],
}

# Pure engines: no socket, poll, thread, lock or clock header, project or system.
PURE = ("src/client/link/grant_session.h", "src/client/link/grant_session.cc",
        "src/scheduler/policy/")
IMPURE_SYSTEM = {"sys/socket.h", "sys/un.h", "poll.h", "sys/epoll.h", "pthread.h", "thread",
                 "mutex", "condition_variable", "shared_mutex", "future", "atomic", "ctime",
                 "time.h", "sys/time.h", "unistd.h", "fcntl.h"}
IMPURE_PROJECT = {"common/clock.h", "common/unix_socket.h", "common/log.h"}
# The engines may log through actions only; common/log.h is allowed where it is only the level type.
PURE_ALLOWED_PROJECT = {"src/client/link/grant_session.h": {"common/log.h"}}

INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def source_files(root):
    for base, _, files in os.walk(os.path.join(root, "src")):
        for name in files:
            if name.endswith((".h", ".cc", ".c", ".def")):
                path = os.path.join(base, name)
                yield os.path.relpath(path, root).replace(os.sep, "/"), path


def rule_for(table, rel):
    best = None
    for key in table:
        if rel == key or (key.endswith("/") and rel.startswith(key)):
            if best is None or len(key) > len(best):
                best = key
    return best


def main(argv):
    root = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
    failures = []
    checked = 0
    for rel, path in source_files(root):
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines()
        allowed_key = rule_for(ALLOWED, rel)
        pure_key = rule_for(PURE, rel)
        for number, line in enumerate(lines, 1):
            match = INCLUDE.match(line)
            if not match:
                continue
            kind, header = match.groups()
            checked += 1
            where = f"{rel}:{number}: #include {kind}{header}{'>' if kind == '<' else kind}"
            if kind == '"' and header.startswith("tools/") and not rel.startswith("src/tools/"):
                failures.append(f"{where}: nothing outside src/tools includes a tools header")
            if allowed_key and kind == '"' and "/" in header:
                if not any(header == a or header.startswith(a) for a in ALLOWED[allowed_key]):
                    failures.append(f"{where}: {allowed_key} may include only "
                                    f"{', '.join(ALLOWED[allowed_key])}")
            if pure_key:
                impure = (header in IMPURE_SYSTEM if kind == "<" else
                          header in IMPURE_PROJECT and
                          header not in PURE_ALLOWED_PROJECT.get(rel, set()))
                if impure:
                    failures.append(f"{where}: a pure engine reads no clock and touches no socket, "
                                    f"thread or lock")
    for failure in failures:
        print(f"FAIL: {failure}")
    print(f"check_layers: {checked} includes checked; {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
