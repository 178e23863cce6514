#!/usr/bin/env python3
"""Checks deploy/docker/install-library.sh, the init container that puts libnvshare.so on the host.

  check_install_library.py [REPOSITORY_ROOT]

Runs the script in a private temporary directory and checks that it installs the file, replaces an
old one by rename (a reader holding the old file keeps reading the old bytes; no partial file is ever
visible under the final name), leaves no temporary file behind, does not rewrite a current file, and
fails clearly on bad input. Standard library only; exit status 0 when everything holds.
"""

import os
import stat
import subprocess
import sys
import tempfile

FAILURES = []


def check(condition, message):
    if not condition:
        FAILURES.append(message)


def run(script, *args):
    return subprocess.run(["sh", script, *args], capture_output=True, text=True, timeout=60,
                          check=False)


def main(argv):
    root = os.path.abspath(argv[1] if len(argv) > 1 else
                           os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    script = os.path.join(root, "deploy/docker/install-library.sh")
    with tempfile.TemporaryDirectory(prefix="nvshare-install-") as temp:
        source = os.path.join(temp, "libnvshare.so")
        host_dir = os.path.join(temp, "host", "lib")
        os.makedirs(host_dir)
        destination = os.path.join(host_dir, "libnvshare.so")
        with open(source, "wb") as handle:
            handle.write(b"first version\n" * 1000)

        result = run(script)
        check(result.returncode == 2, f"no arguments: exit {result.returncode}, expected 2")
        check("usage" in result.stderr, "no arguments: no usage message")

        result = run(script, source, os.path.join(temp, "missing", "libnvshare.so"))
        check(result.returncode == 1, f"missing directory: exit {result.returncode}, expected 1")
        check("does not exist" in result.stderr, "missing directory: no clear message")

        result = run(script, os.path.join(temp, "nothing.so"), destination)
        check(result.returncode == 1, f"missing source: exit {result.returncode}, expected 1")
        check(not os.path.exists(destination), "missing source: something was installed")

        result = run(script, source, destination)
        check(result.returncode == 0, f"first install: exit {result.returncode}: {result.stderr}")
        with open(destination, "rb") as handle:
            check(handle.read() == b"first version\n" * 1000, "first install: wrong content")
        mode = stat.S_IMODE(os.stat(destination).st_mode)
        check(mode == 0o644, f"installed mode {oct(mode)}, expected 0o644")
        check(sorted(os.listdir(host_dir)) == ["libnvshare.so"],
              f"first install left files: {sorted(os.listdir(host_dir))}")
        first_inode = os.stat(destination).st_ino

        result = run(script, source, destination)
        check(result.returncode == 0 and "is current" in result.stdout,
              f"second install of the same bytes: exit {result.returncode}, {result.stdout!r}")
        check(os.stat(destination).st_ino == first_inode, "a current file was rewritten")

        # A process that mapped the old library keeps it: the new file arrives by rename.
        old_reader = open(destination, "rb")  # noqa: SIM115 (held across the replacement)
        try:
            with open(source, "wb") as handle:
                handle.write(b"second version\n" * 1000)
            result = run(script, source, destination)
            check(result.returncode == 0, f"replacement: exit {result.returncode}: {result.stderr}")
            check(os.stat(destination).st_ino != first_inode,
                  "replacement wrote into the old file instead of renaming a new one over it")
            with open(destination, "rb") as handle:
                check(handle.read() == b"second version\n" * 1000, "replacement: wrong content")
            check(old_reader.read() == b"first version\n" * 1000,
                  "a reader of the old file saw it change")
        finally:
            old_reader.close()
        check(sorted(os.listdir(host_dir)) == ["libnvshare.so"],
              f"replacement left files: {sorted(os.listdir(host_dir))}")

    for failure in FAILURES:
        print(f"FAIL: {failure}")
    print(f"check_install_library: {len(FAILURES)} failure(s)")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
