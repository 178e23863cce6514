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

}  // namespace nvshare::tools
