// The client library's configuration: every knob of libnvshare.so defined once, in one table.
//
// libnvshare.so lives inside other people's processes, so it has no flags and no configuration
// file: each knob is an NVSHARE_* environment variable, read once per process (client_config()).
// The table (client_knobs()) is the only definition of a knob's name, variable, default, range and
// meaning; parsing and the table in docs/configuration.md are both generated from it (a unit test
// checks that the document is current).
//
// Contract
//  - Parsing never fails, exits or throws: a value that is malformed or out of range produces one
//    warning naming the variable, the value and what is accepted, and the knob keeps its default.
//    An empty value counts as unset.
//  - client_config() parses the process environment and the settings file (kSettingsPath) on first
//    use (thread-safe), logs the warnings then, and returns the same object for the life of the
//    process (a forked child inherits it).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "client/settings_file.h"
#include "common/clock.h"
#include "common/log.h"
#include "common/memory_mode.h"
#include "common/protocol.h"
#include "common/result.h"

namespace nvshare::client {

struct ClientConfig {
  // false: pure pass-through; the library neither gates nor talks to a scheduler.
  bool enabled = true;
  // The scheduler's client socket.
  std::string socket_path;
  // A holder idle this long gives its grant back; zero turns idle release off.
  Duration idle_release = std::chrono::milliseconds(100);
  // The hooks keep at most about this much GPU work queued, so a revoke drains quickly.
  Duration drain_bound = std::chrono::milliseconds(50);
  // Limits the process declares for itself (memory 0: none; core 100: uncapped). They are enforced
  // locally from the start and honoured by a scheduler that trusts client limits.
  protocol::Limits declared_limits;
  // Declared pod identity (informational unless the scheduler trusts clients).
  std::string pod_uid;
  // How device allocations are backed (common/memory_mode.h), when the process chose; nullopt:
  // the mode the scheduler gives (the pod's annotation or its default), else device.
  std::optional<MemoryMode> memory_mode;
  // Upper bound of the reconnect backoff after the scheduler went away.
  Duration reconnect_max = std::chrono::milliseconds(2000);
  // How long the first CUDA call on a GPU waits for the scheduler's welcome and limits (zero: not
  // at all); see device_link.h.
  Duration register_wait = std::chrono::milliseconds(1000);
  LogLevel log_level = LogLevel::kInfo;
  // Where to append the grant life-cycle trace (link/handoff_trace.h); empty: no trace.
  std::string trace_file;
  // A settings file (settings_file.h) governs this process: the knobs that weaken enforcement come
  // from it, not from the environment.
  bool enforced = false;
  // The settings file says the pod's memory limit is not known yet: allocations wait for it (and
  // fail while neither the scheduler nor the file gives it).
  bool memory_limit_pending = false;
  // The settings file the link re-reads while the limit is pending or the scheduler unreachable.
  std::string settings_path;
};

struct ClientKnob {
  std::string_view name;           // "idle-release-ms"; the variable is NVSHARE_IDLE_RELEASE_MS
  std::string_view default_value;  // as the variable would spell it; empty: unset
  std::string_view range;
  std::string_view meaning;
  Status (*apply)(std::string_view value, ClientConfig& config);
};

std::span<const ClientKnob> client_knobs();
const ClientKnob* find_client_knob(std::string_view name);
std::string client_env_name(const ClientKnob& knob);  // "NVSHARE_IDLE_RELEASE_MS"

// The configuration from every knob's default (valid by construction; a test checks it).
ClientConfig default_client_config();

using ClientEnvLookup = std::function<const char*(const char*)>;

struct ParsedClientConfig {
  ClientConfig config;
  // One message per rejected value: "NVSHARE_CORE_LIMIT=150: ...; using the default 100".
  std::vector<std::string> warnings;
};

// Builds the configuration from the defaults and the environment as `getenv` sees it, then from
// the container's settings file when there is one (settings_file.h: with enforce=1 its values win
// and the environment's enable, socket, register-wait-ms and reconnect-max-ms are ignored, each
// with a warning; a declared memory limit only lowers the file's).
ParsedClientConfig parse_client_config(const ClientEnvLookup& getenv,
                                       const std::optional<ClientSettings>& settings = {});

// The process's configuration, parsed from its environment on first use.
const ClientConfig& client_config();

// The Markdown table of docs/configuration.md's client section, generated from the table.
std::string client_config_doc_table();

}  // namespace nvshare::client
