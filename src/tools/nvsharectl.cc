// nvsharectl: the operator's view of and handle on the node scheduler, through its control socket.
//
//   nvsharectl [--control-socket PATH] [--timeout SECONDS] COMMAND [OPTIONS]
//
// Exit status: 0 success; 1 the scheduler refused the request (its error is printed); 2 usage
// error; 3 the scheduler cannot be reached or did not answer.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/default_paths.h"
#include "common/json.h"
#include "common/knob_parse.h"
#include "common/shared_knobs.h"
#include "control/client.h"
#include "tools/status_table.h"

namespace {

using nvshare::Json;

constexpr int kExitOk = 0;
constexpr int kExitRefused = 1;
constexpr int kExitUsage = 2;
constexpr int kExitUnreachable = 3;

constexpr const char* kUsage =
    R"(Usage: nvsharectl [--control-socket PATH] [--timeout SECONDS] COMMAND [OPTIONS]

Commands:
  status [--json]                   per GPU: clients, their state, memory and compute limits
  top [--interval S] [--iterations N] [--json]
                                    per pod: GPU share, waits by reason, memory, swap
                                    over each interval, then status; refreshed every S
                                    seconds (default 1; N = 0: forever)
  set-limits SELECTOR [--memory Q|none|inherit] [--core P|none|inherit]
             [--memory-mode device|unified|plain|inherit] [--priority high|normal|low|inherit]
        SELECTOR: --client ID | --pid PID | --pod-uid UID [--pod NS/NAME] | --pod NS/NAME
                                    limits for a client, a process or a pod (remembered for
                                    the pod's later processes); none removes a limit, inherit
                                    drops an override; the memory mode applies to allocations
                                    made from then on; the priority class at once
  forget-pod UID                    forget a pod's remembered limits (the pod is gone)
  set-policy [--gpu UUID] [--mode M] [--quantum S|auto] [--quota-window MS] [--capacity Q]
             [--reserve P] [--quantum-k K] [--quantum-min S] [--quantum-max S]
             [--turn-slice S] [--cap-cycle S] [--priority-interference P]
             [--priority-floor S] [--revoke-grace S] [--swap-allowance-max S]
             [--swap-bandwidth B] [--swap-bandwidth-floor B]
                                    change policy knobs for one GPU or all
                                    (see nvshare-scheduler --help)
  explain CLIENT                    why a client runs or waits, with the numbers
  stats [--json] [--reset]          the scheduler's traffic counters and decision latency
  version                           the scheduler's version

The control socket is --control-socket, else $NVSHARE_CONTROL_SOCKET, else )";

struct Global {
  std::string socket;
  int timeout_ms = 5000;
};

int usage_error(const std::string& message) {
  std::fprintf(stderr, "nvsharectl: %s\nRun 'nvsharectl --help' for usage.\n", message.c_str());
  return kExitUsage;
}

// Arguments of one command: flags with values, switches, positionals.
class Args {
 public:
  Args(std::vector<std::string> args, std::vector<std::string> value_flags,
       std::vector<std::string> switches)
      : args_(std::move(args)),
        value_flags_(std::move(value_flags)),
        switches_(std::move(switches)) {}

  std::optional<std::string> parse() {
    for (std::size_t i = 0; i < args_.size(); ++i) {
      std::string arg = args_[i];
      if (arg.rfind("--", 0) != 0) {
        positionals_.push_back(arg);
        continue;
      }
      std::string value;
      bool has_value = false;
      if (const auto eq = arg.find('='); eq != std::string::npos) {
        value = arg.substr(eq + 1);
        arg = arg.substr(0, eq);
        has_value = true;
      }
      const std::string name = arg.substr(2);
      if (std::find(switches_.begin(), switches_.end(), name) != switches_.end()) {
        if (has_value) return "flag " + arg + " takes no value";
        switches_set_.push_back(name);
        continue;
      }
      if (std::find(value_flags_.begin(), value_flags_.end(), name) == value_flags_.end()) {
        return "unknown flag " + arg;
      }
      if (!has_value) {
        if (i + 1 >= args_.size()) return "flag " + arg + " needs a value";
        value = args_[++i];
      }
      if (values_.count(name)) return "flag " + arg + " given twice";
      values_[name] = value;
    }
    return std::nullopt;
  }

  std::optional<std::string> value(const std::string& name) const {
    auto it = values_.find(name);
    return it == values_.end() ? std::nullopt : std::optional<std::string>(it->second);
  }
  bool has(const std::string& name) const {
    return std::find(switches_set_.begin(), switches_set_.end(), name) != switches_set_.end();
  }
  const std::vector<std::string>& positionals() const { return positionals_; }
  const std::map<std::string, std::string>& values() const { return values_; }

 private:
  std::vector<std::string> args_;
  std::vector<std::string> value_flags_;
  std::vector<std::string> switches_;
  std::map<std::string, std::string> values_;
  std::vector<std::string> switches_set_;
  std::vector<std::string> positionals_;
};

std::optional<long long> parse_integer(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end == nullptr || *end != '\0') return std::nullopt;
  return value;
}

std::optional<double> parse_seconds(const std::string& text) {
  if (text.empty()) return std::nullopt;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (end == nullptr || *end != '\0' || !(value >= 0)) return std::nullopt;
  return value;
}

// Sends one request and prints why when the scheduler cannot be reached or refuses. Returns the
// answer the request expects.
template <typename R>
std::optional<nvshare::control::AnswerOf<R>> call(const Global& global, const R& request,
                                                  int& exit_code) {
  auto reply = nvshare::control::ask(global.socket, request, global.timeout_ms);
  if (!reply) {
    std::fprintf(stderr, "nvsharectl: %s\n", reply.error().message.c_str());
    exit_code = kExitUnreachable;
    return std::nullopt;
  }
  if (reply.value().refused()) {
    std::fprintf(stderr, "nvsharectl: the scheduler refused: %s\n",
                 reply.value().refusal().c_str());
    exit_code = kExitRefused;
    return std::nullopt;
  }
  exit_code = kExitOk;
  return reply.value().answer();
}

// The answer as the scheduler wrote it (--json).
template <typename A>
void print_json(const A& answer, bool pretty) {
  const Json json = nvshare::control::encode(answer);
  std::printf("%s\n", pretty ? json.dump_pretty().c_str() : json.dump().c_str());
}

int cmd_status(const Global& global, std::vector<std::string> rest) {
  Args args(std::move(rest), {}, {"json"});
  if (auto error = args.parse()) return usage_error(*error);
  if (!args.positionals().empty()) return usage_error("status takes no arguments");
  int code;
  auto answer = call(global, nvshare::control::StatusRequest{}, code);
  if (!answer) return code;
  if (args.has("json")) {
    print_json(*answer, true);
  } else {
    std::fputs(nvshare::tools::render_status_table(answer->body).c_str(), stdout);
  }
  return kExitOk;
}

int cmd_top(const Global& global, std::vector<std::string> rest) {
  Args args(std::move(rest), {"interval", "iterations"}, {"json"});
  if (auto error = args.parse()) return usage_error(*error);
  double interval = 1;
  long long iterations = 0;
  if (auto v = args.value("interval")) {
    auto s = parse_seconds(*v);
    if (!s || *s < 0.05) return usage_error("--interval must be at least 0.05 seconds");
    interval = *s;
  }
  if (auto v = args.value("iterations")) {
    auto n = parse_integer(*v);
    if (!n || *n < 0) return usage_error("--iterations must be a non-negative integer");
    iterations = *n;
  }
  const bool clear = ::isatty(STDOUT_FILENO) && !args.has("json");
  std::optional<Json> previous;
  auto previous_at = std::chrono::steady_clock::now();
  for (long long i = 0; iterations == 0 || i < iterations; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::duration<double>(interval));
    int code;
    auto answer = call(global, nvshare::control::StatusRequest{}, code);
    if (!answer) return code;
    const auto now = std::chrono::steady_clock::now();
    if (args.has("json")) {
      print_json(*answer, false);
    } else {
      if (clear) std::fputs("\x1b[H\x1b[2J", stdout);
      char stamp[32];
      const std::time_t t = std::time(nullptr);
      std::strftime(stamp, sizeof stamp, "%H:%M:%S", std::localtime(&t));
      std::printf("nvsharectl top  %s  every %gs\n\n", stamp, interval);
      const double seconds = std::chrono::duration<double>(now - previous_at).count();
      std::fputs(
          nvshare::tools::render_pod_table(previous ? &*previous : nullptr, answer->body, seconds)
              .c_str(),
          stdout);
      std::fputs("\n", stdout);
      std::fputs(nvshare::tools::render_status_table(answer->body).c_str(), stdout);
      if (!clear) std::fputs("\n", stdout);
    }
    std::fflush(stdout);
    previous = answer->body;
    previous_at = now;
  }
  return kExitOk;
}

// Turns a --memory/--core value into its JSON form.
// The decoder's message about a request member, as the flag that set it: `memory_mode` is
// --memory-mode, and the JSON values null, "none" and "inherit" are the words none and inherit.
std::string in_flag_words(std::string message) {
  const auto replace_all = [&](std::string_view from, std::string_view to) {
    for (std::size_t at = message.find(from); at != std::string::npos;
         at = message.find(from, at + to.size())) {
      message.replace(at, from.size(), to);
    }
  };
  replace_all("null, \"none\"", "none");
  replace_all("\"none\"", "none");
  replace_all("\"inherit\"", "inherit");
  for (const char* member : {"memory_mode", "memory", "core", "priority"}) {
    const std::string name(member);
    if (message.rfind(name, 0) == 0) {
      std::string flag = "--" + name;
      std::replace(flag.begin(), flag.end(), '_', '-');
      message.replace(0, name.size(), flag);
      break;
    }
  }
  return message;
}

Json limit_value(const std::string& text, bool core) {
  if (text == "none") return Json();
  if (text == "inherit") return Json("inherit");
  if (core) {
    if (auto n = parse_integer(text)) return Json(*n);
  }
  return Json(text);
}

int cmd_set_limits(const Global& global, std::vector<std::string> rest) {
  Args args(std::move(rest),
            {"client", "pid", "pod-uid", "pod", "memory", "core", "memory-mode", "priority"}, {});
  if (auto error = args.parse()) return usage_error(*error);
  if (!args.positionals().empty()) return usage_error("set-limits takes no positional arguments");
  Json selector = Json::object();
  if (auto v = args.value("client")) {
    auto n = parse_integer(*v);
    if (!n || *n < 1) return usage_error("--client must be a client id (a positive integer)");
    selector.set("client", *n);
  }
  if (auto v = args.value("pid")) {
    auto n = parse_integer(*v);
    if (!n || *n < 1) return usage_error("--pid must be a process id");
    selector.set("pid", *n);
  }
  if (auto v = args.value("pod-uid")) selector.set("pod_uid", *v);
  if (auto v = args.value("pod")) {
    const auto slash = v->find('/');
    if (slash == std::string::npos || slash == 0 || slash + 1 == v->size()) {
      return usage_error("--pod must be NAMESPACE/NAME");
    }
    selector.set("namespace", v->substr(0, slash));
    selector.set("name", v->substr(slash + 1));
  }
  if (selector.as_object()->empty()) {
    return usage_error("set-limits needs --client, --pid, --pod-uid or --pod");
  }
  const auto memory = args.value("memory");
  const auto core = args.value("core");
  const auto mode = args.value("memory-mode");
  const auto priority = args.value("priority");
  if (!memory && !core && !mode && !priority) {
    return usage_error("set-limits needs --memory, --core, --memory-mode and/or --priority");
  }
  Json request = Json::object();
  request.set("cmd", "set-limits");
  request.set("selector", std::move(selector));
  if (memory) request.set("memory", limit_value(*memory, false));
  if (core) request.set("core", limit_value(*core, true));
  if (mode) request.set("memory_mode", *mode);
  if (priority) request.set("priority", *priority);
  // The flags' values are checked by the protocol's own decoder, so nvsharectl accepts exactly
  // what the scheduler does; what it refuses is a usage error (exit 2), said in the flags' words.
  auto typed = nvshare::control::decode(request);
  if (!typed) return usage_error(in_flag_words(typed.error().message));
  int code;
  auto answer = call(global, std::get<nvshare::control::SetLimitsRequest>(typed.value()), code);
  if (!answer) return code;
  const std::size_t n_clients = answer->clients.size();
  const std::size_t n_pods = answer->pods.size();
  std::printf("limits updated: %zu client%s", n_clients, n_clients == 1 ? "" : "s");
  if (n_pods > 0) std::printf(", %zu pod%s remembered", n_pods, n_pods == 1 ? "" : "s");
  std::printf("\n");
  return kExitOk;
}

int cmd_forget_pod(const Global& global, std::vector<std::string> rest) {
  Args args(std::move(rest), {}, {});
  if (auto error = args.parse()) return usage_error(*error);
  if (args.positionals().size() != 1) return usage_error("forget-pod takes one pod UID");
  int code;
  auto answer = call(global, nvshare::control::ForgetPodRequest{args.positionals()[0]}, code);
  if (!answer) return code;
  std::printf("forgot pod %s\n", args.positionals()[0].c_str());
  return kExitOk;
}

int cmd_set_policy(const Global& global, std::vector<std::string> rest) {
  // Flag -> request member (docs/control-api.md).
  static const std::map<std::string, std::string> kMembers = {
      {"mode", "mode"},
      {"quantum", "quantum"},
      {"quota-window", "quota_window_ms"},
      {"capacity", "capacity"},
      {"reserve", "reserve"},
      {"quantum-k", "quantum_k"},
      {"quantum-min", "quantum_min"},
      {"quantum-max", "quantum_max"},
      {"turn-slice", "turn_slice"},
      {"cap-cycle", "cap_cycle"},
      {"priority-interference", "priority_interference"},
      {"priority-floor", "priority_floor"},
      {"revoke-grace", "revoke_grace"},
      {"swap-allowance-max", "swap_allowance_max"},
      {"swap-bandwidth", "swap_bandwidth"},
      {"swap-bandwidth-floor", "swap_bandwidth_floor"}};
  std::vector<std::string> flags = {"gpu"};
  for (const auto& [flag, member] : kMembers) flags.push_back(flag);
  Args args(std::move(rest), flags, {});
  if (auto error = args.parse()) return usage_error(*error);
  if (!args.positionals().empty()) return usage_error("set-policy takes no positional arguments");
  Json request = Json::object();
  request.set("cmd", "set-policy");
  if (auto gpu = args.value("gpu")) request.set("gpu", *gpu);
  bool any = false;
  for (const auto& [flag, value] : args.values()) {
    if (flag == "gpu") continue;
    request.set(kMembers.at(flag), value);
    any = true;
  }
  if (!any) return usage_error("set-policy needs at least one setting");
  auto typed = nvshare::control::decode(request);
  if (!typed) return usage_error(typed.error().message);
  int code;
  auto answer = call(global, std::get<nvshare::control::SetPolicyRequest>(typed.value()), code);
  if (!answer) return code;
  const std::size_t n = answer->gpus.size();
  std::printf("policy updated (%zu active GPU%s reconfigured)\n", n, n == 1 ? "" : "s");
  return kExitOk;
}

int cmd_explain(const Global& global, std::vector<std::string> rest) {
  Args args(std::move(rest), {}, {"json"});
  if (auto error = args.parse()) return usage_error(*error);
  if (args.positionals().size() != 1) return usage_error("explain takes one client id");
  auto id = parse_integer(args.positionals()[0]);
  if (!id || *id < 1) return usage_error("explain takes a client id (a positive integer)");
  int code;
  auto answer =
      call(global, nvshare::control::ExplainRequest{static_cast<std::uint64_t>(*id)}, code);
  if (!answer) return code;
  if (args.has("json")) {
    print_json(*answer, true);
    return kExitOk;
  }
  std::printf("client %lld on %s: %s\n%s\n", *id, answer->gpu.c_str(), answer->state.c_str(),
              answer->explanation.c_str());
  return kExitOk;
}

int cmd_stats(const Global& global, std::vector<std::string> rest) {
  Args args(std::move(rest), {}, {"json", "reset"});
  if (auto error = args.parse()) return usage_error(*error);
  int code;
  auto answer = call(global, nvshare::control::StatsRequest{args.has("reset")}, code);
  if (!answer) return code;
  if (args.has("json")) {
    print_json(*answer, true);
    return kExitOk;
  }
  const auto counter = [&](const char* name) {
    for (const auto& [key, value] : answer->sessions) {
      if (key == name) return std::to_string(value);
    }
    return std::string("-");
  };
  const auto us = [](double value) { return Json(value).dump(); };
  const nvshare::control::LatencySummary& latency = answer->decision_latency_us;
  std::printf("frames in %llu, out %llu\n",
              static_cast<unsigned long long>(answer->frames_in_total),
              static_cast<unsigned long long>(answer->frames_out_total));
  std::printf("decision latency (us): count %llu  p50 %s  p99 %s  max %s\n",
              static_cast<unsigned long long>(latency.count), us(latency.p50).c_str(),
              us(latency.p99).c_str(), us(latency.max).c_str());
  std::printf(
      "sessions: open %s  opened %s  closed %s (malformed %s, protocol %s, version %s, slow %s)\n",
      counter("open").c_str(), counter("opened").c_str(), counter("closed").c_str(),
      counter("closed_malformed").c_str(), counter("closed_protocol").c_str(),
      counter("closed_version").c_str(), counter("closed_slow").c_str());
  return kExitOk;
}

int cmd_version(const Global& global, const std::vector<std::string>& rest) {
  if (!rest.empty()) return usage_error("version takes no arguments");
  int code;
  auto answer = call(global, nvshare::control::VersionRequest{}, code);
  if (!answer) return code;
  std::printf("scheduler %s\n", answer->version.c_str());
  return kExitOk;
}

}  // namespace

int main(int argc, char** argv) {
  Global global;
  // The control socket is the scheduler's control-socket knob (common/shared_knobs.h): its
  // environment variable, else its default; --control-socket below overrides both.
  const std::string env_name =
      "NVSHARE_" + nvshare::knobparse::upper_snake(nvshare::knobtable::kControlSocket.name);
  global.socket = nvshare::knobtable::kControlSocket.default_value;
  if (const char* env = std::getenv(env_name.c_str()); env != nullptr && *env != '\0') {
    auto path = nvshare::knobparse::parse_socket_path(env);
    if (!path) return usage_error(env_name + ": " + path.error().message);
    global.socket = std::move(path).value();
  }
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "help") {
      std::printf("%s%s\n", kUsage, nvshare::kDefaultControlSocketPath);
      return kExitOk;
    }
    if (arg.rfind("--", 0) != 0) break;
    std::string value;
    const auto eq = arg.find('=');
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      return usage_error("flag " + arg + " needs a value");
    }
    if (arg == "--control-socket") {
      auto path = nvshare::knobparse::parse_socket_path(value);
      if (!path) return usage_error("--control-socket: " + path.error().message);
      global.socket = std::move(path).value();
    } else if (arg == "--timeout") {
      auto seconds = parse_seconds(value);
      if (!seconds || *seconds <= 0 || *seconds > 3600)
        return usage_error("--timeout must be 0..3600 seconds");
      global.timeout_ms = static_cast<int>(*seconds * 1000);
    } else {
      return usage_error("unknown flag " + arg);
    }
  }
  if (i >= argc) return usage_error("no command given");
  const std::string command = argv[i];
  std::vector<std::string> rest(argv + i + 1, argv + argc);
  static const std::map<std::string, std::function<int(const Global&, std::vector<std::string>)>>
      kCommands = {{"status", cmd_status},         {"top", cmd_top},
                   {"set-limits", cmd_set_limits}, {"forget-pod", cmd_forget_pod},
                   {"set-policy", cmd_set_policy}, {"explain", cmd_explain},
                   {"stats", cmd_stats},           {"version", cmd_version}};
  auto it = kCommands.find(command);
  if (it == kCommands.end()) return usage_error("unknown command \"" + command + "\"");
  return it->second(global, std::move(rest));
}
