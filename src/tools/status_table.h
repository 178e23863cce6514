// Renders the control API's status response as the text nvsharectl prints: per GPU a header line
// and a table of its clients (id, pid, pod, process, state, waiting reason, memory allocated /
// limit, core cap / effective share over the last quota window), then the pods with remembered
// limits.
//
// Pure (JSON in, text out) and tolerant: a missing field shows as "-", so an older or newer
// scheduler's status still renders.
#pragma once

#include <string>

#include "common/json.h"

namespace nvshare::tools {

std::string render_status_table(const Json& status);

// nvsharectl top's per-pod table, what the Grafana dashboard shows (docs/metrics.md): per pod (a
// process outside pods is its own row) and GPU, its share of the GPU's time and its waits by reason
// over the `seconds` between two status responses (the counters' rates, as PromQL's rate() reads
// them; "-" without a previous response), its cap, its memory allocated / on the GPU / limit, and
// its swap traffic. Clients are matched between the two responses by id.
std::string render_pod_table(const Json* previous, const Json& current, double seconds);

}  // namespace nvshare::tools
