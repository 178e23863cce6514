// Which Kubernetes pod a process belongs to, from its cgroup.
//
// The scheduler learns a client's pid from SO_PEERCRED and reads /proc/<pid>/cgroup; the kubelet
// puts every container of a pod under a cgroup named after the pod's UID, whatever the cgroup
// version, the cgroup driver or the container runtime:
//
//   cgroup v2, systemd driver, containerd:
//     0::/kubepods.slice/kubepods-burstable.slice/
//        kubepods-burstable-pod7d3f9a2e_1c4b_4e8f_9a6d_2b5c8e1f0a3d.slice/cri-containerd-<id>.scope
//     (one line in the file; split here)
//   cgroup v1, cgroupfs driver (any runtime):
//     12:memory:/kubepods/besteffort/pod7d3f9a2e-1c4b-4e8f-9a6d-2b5c8e1f0a3d/<id>
//   CRI-O and Docker (systemd driver): the container scope is crio-<id>.scope or docker-<id>.scope
//   containerd with the systemd driver on cgroup v1:
//   .../kubepods-besteffort-pod<uid>.slice:cri-containerd:<id> a scheduler in its own cgroup
//   namespace sees paths relative to its own cgroup: 0::/../../pod<uid>/<id>
//
// Systemd slice names cannot hold '-' inside a unit name component, so the UID's dashes appear as
// underscores there; the result is always the canonical form (lowercase, dashes). Static pods,
// which the kubelet names by a 32-hex-digit hash, are recognized the same way.
//
// Contract: parse_pod_identity is pure and total (any text in, never fails; nullopt pod_uid when
// the process is not in a pod). A pod segment is recognized only as a whole path segment `pod<uid>`
// (cgroupfs) or a slice whose name contains "kubepods" and ends in `-pod<uid>.slice` (systemd), so
// a UUID elsewhere in a path is never mistaken for a pod; and only where the kubelet puts pods: a
// `pod<uid>` segment below a kubepods (or kubelet) segment or in a path relative to the reader's
// cgroup namespace, and never inside a user's delegated tree (user.slice, user-N.slice,
// user@N.service), where a logged-in user may name a cgroup after any pod.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>
#include <string_view>

#include "common/result.h"

namespace nvshare::scheduler {

struct PodIdentity {
  std::optional<std::string> pod_uid;       // canonical UID, nullopt when not in a pod
  std::optional<std::string> container_id;  // runtime container ID (hex) when the path names one
  // The process's cgroup: the unified hierarchy's path (the "0::" line), else the first line's.
  // What groups the processes of one job off Kubernetes (a container, a systemd scope or service).
  std::string cgroup;
  // A pod-like segment that was not taken for a pod, and why (a user's delegated tree, outside the
  // kubelet's hierarchy): the process counts as outside any pod.
  std::optional<std::string> refused;
  bool operator==(const PodIdentity&) const = default;
};

// A pod UID in canonical form: a UUID (8-4-4-4-12 hex digits, '-' or systemd's '_' between the
// groups, any letter case) in lowercase with dashes, or a static pod's 32 hex digits in lowercase.
// nullopt for anything else. Every pod UID the scheduler stores or compares is in this form.
std::optional<std::string> canonical_pod_uid(std::string_view text);

// Parses the text of /proc/<pid>/cgroup (one `hierarchy:controllers:path` per line). The first line
// naming a pod wins (all lines of a containerized process name the same pod); `cgroup` is filled
// whether or not a pod is named.
PodIdentity parse_pod_identity(std::string_view cgroup_file);

// Reads <proc_root>/<pid>/cgroup and parses it. Fails only when the file cannot be read (the
// process has exited, or /proc is not the host's).
Result<PodIdentity> read_pod_identity(pid_t pid, const std::string& proc_root = "/proc");

}  // namespace nvshare::scheduler
