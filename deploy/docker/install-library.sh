#!/bin/sh
# Installs libnvshare.so onto the host, atomically, for the device plugin to mount into GPU containers.
#
#   nvshare-install-library SOURCE DESTINATION
#
# Runs as the init container of the device plugin's pod, with the host directory of DESTINATION
# mounted. The library is copied next to DESTINATION under a temporary name and renamed over it, so a
# container that starts at the same moment mounts either the old file or the new one, never a partial
# one; processes that already mapped the old file keep its inode. Nothing is written when SOURCE and
# DESTINATION already hold the same bytes, so restarting the pod leaves the installed file alone.
# Exit status: 0 installed (or already current), 1 failure (message on stderr), 2 usage error.
set -eu

if [ "$#" -ne 2 ]; then
  echo "usage: nvshare-install-library SOURCE DESTINATION" >&2
  exit 2
fi
source_file=$1
destination=$2
destination_dir=$(dirname -- "$destination")

if [ ! -f "$source_file" ]; then
  echo "nvshare-install-library: $source_file is not a file" >&2
  exit 1
fi
if [ ! -d "$destination_dir" ]; then
  echo "nvshare-install-library: directory $destination_dir does not exist (is the host path mounted?)" >&2
  exit 1
fi

if [ -f "$destination" ] && cmp -s -- "$source_file" "$destination"; then
  echo "nvshare-install-library: $destination is current"
  exit 0
fi

temporary="$destination_dir/.$(basename -- "$destination").tmp.$$"
trap 'rm -f -- "$temporary"' EXIT
cp -- "$source_file" "$temporary"
chmod 0644 -- "$temporary"
# The bytes reach the disk before the name points at them (a host crash cannot leave an empty file
# under the final name).
sync "$temporary" 2>/dev/null || sync
mv -f -- "$temporary" "$destination"
trap - EXIT
echo "nvshare-install-library: installed $destination"
