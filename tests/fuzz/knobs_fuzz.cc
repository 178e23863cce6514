// Fuzz target: the knob parsers. The input is split at NUL bytes into words; the scheduler reads
// them as its command line (and as the value of each knob through its environment variable), the
// client library as the values of its environment variables, and the shared value parsers as
// texts.
//
// Properties: nothing crashes; every refusal says why; a configuration the scheduler accepts has
// valid policy settings and two different sockets.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "client/config.h"
#include "common/knob_parse.h"
#include "fuzz_check.h"
#include "scheduler/knobs.h"
#ifdef NVSHARE_FUZZ_PLUGIN_KNOBS
#include "deviceplugin/knobs.h"
#endif

using nvshare::fuzz::check;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::vector<std::string> words;
  std::string word;
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      words.push_back(word);
      word.clear();
    } else {
      word.push_back(static_cast<char>(data[i]));
    }
  }
  words.push_back(word);

  // The scheduler's command line.
  std::vector<const char*> argv = {"nvshare-scheduler"};
  for (const std::string& w : words) argv.push_back(w.c_str());
  auto parsed =
      nvshare::scheduler::parse_command_line(static_cast<int>(argv.size()), argv.data(),
                                             [](const char*) -> const char* { return nullptr; });
  if (parsed.ok()) {
    check(nvshare::policy::validate(parsed.value().config.policy).ok());
    check(nvshare::scheduler::check_sockets_differ(parsed.value().config).ok());
  } else {
    check(!parsed.error().message.empty());
  }

  // Each word as every scheduler knob's environment value, and as every client knob's.
  std::map<std::string, std::string> env;
  std::size_t next = 0;
  for (const auto& knob : nvshare::scheduler::knobs()) {
    if (words.empty()) break;
    env[nvshare::scheduler::env_name(knob)] = words[next++ % words.size()];
  }
  for (const auto& knob : nvshare::client::client_knobs()) {
    if (words.empty()) break;
    env[nvshare::client::client_env_name(knob)] = words[next++ % words.size()];
  }
  const auto lookup = [&](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  };
  const char* program[] = {"nvshare-scheduler"};
  auto from_env = nvshare::scheduler::parse_command_line(1, program, lookup);
  if (!from_env.ok()) check(!from_env.error().message.empty());
  const nvshare::client::ParsedClientConfig client = nvshare::client::parse_client_config(lookup);
  for (const std::string& warning : client.warnings) check(!warning.empty());

#ifdef NVSHARE_FUZZ_PLUGIN_KNOBS
  // The device plugin's command line.
  std::vector<const char*> plugin_argv = {"nvshare-device-plugin"};
  for (const std::string& w : words) plugin_argv.push_back(w.c_str());
  auto plugin = nvshare::deviceplugin::parse_command_line(
      static_cast<int>(plugin_argv.size()), plugin_argv.data(),
      [](const char*) -> const char* { return nullptr; });
  if (!plugin.ok()) check(!plugin.error().message.empty());
#endif

  // The shared value parsers.
  namespace kp = nvshare::knobparse;
  for (const std::string& w : words) {
    (void)kp::parse_decimal(w, -1e6, 1e6, " units");
    (void)kp::parse_seconds(w, 0, 86400);
    (void)kp::parse_seconds_with_unit(w, 0, 86400);
    (void)kp::parse_integer(w, -1000, 1000);
    (void)kp::parse_bool(w);
    (void)kp::parse_log_level(w);
    if (auto items = kp::split_list(w, "list")) {
      for (const auto& item : items.value()) check(!item.empty());
    }
  }
  return 0;
}
