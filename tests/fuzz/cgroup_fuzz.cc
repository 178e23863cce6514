// Fuzz target: a process's cgroup file, as the scheduler reads it to find the pod of a client.
//
// Properties: parsing never crashes or reads out of bounds; a pod UID it finds is in canonical
// form (canonical_pod_uid gives it back unchanged), and so is anything canonical_pod_uid accepts.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz_check.h"
#include "scheduler/pod_identity.h"

using nvshare::fuzz::check;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const nvshare::scheduler::PodIdentity identity = nvshare::scheduler::parse_pod_identity(text);
  if (identity.pod_uid) {
    check(nvshare::scheduler::canonical_pod_uid(*identity.pod_uid) == identity.pod_uid);
  } else {
    check(!identity.container_id.has_value());
  }
  if (auto uid = nvshare::scheduler::canonical_pod_uid(text)) {
    check(nvshare::scheduler::canonical_pod_uid(*uid) == uid);
    check(uid->size() == 36 || uid->size() == 32);
  }
  return 0;
}
