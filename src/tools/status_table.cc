#include "tools/status_table.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <string_view>
#include <vector>

#include "common/quantity.h"

namespace nvshare::tools {
namespace {

using Row = std::vector<std::string>;

std::string text_of(const Json* value) {
  if (value == nullptr || value->is_null()) return "-";
  if (const std::string* s = value->as_string()) return s->empty() ? "-" : *s;
  return value->dump();
}

std::string bytes_of(const Json* value) {
  if (value == nullptr) return "-";
  const auto n = value->as_int64();
  if (!n || *n < 0) return "-";
  return format_bytes(static_cast<std::uint64_t>(*n));
}

std::string percent_of(const Json* value) {
  if (value == nullptr) return "-";
  const auto d = value->as_double();
  if (!d) return "-";
  char out[32];
  if (*d == static_cast<double>(static_cast<long long>(*d))) {
    std::snprintf(out, sizeof out, "%lld%%", static_cast<long long>(*d));
  } else {
    std::snprintf(out, sizeof out, "%.1f%%", *d);
  }
  return out;
}

std::string duration_ms_of(const Json* value) {
  if (value == nullptr) return "-";
  const auto d = value->as_double();
  if (!d) return "-";
  char out[32];
  if (*d >= 1000) {
    std::snprintf(out, sizeof out, "%gs", *d / 1000);
  } else {
    std::snprintf(out, sizeof out, "%gms", *d);
  }
  return out;
}

std::string pod_of(const Json& client) {
  const Json* ns = client.find("namespace");
  const Json* name = client.find("pod");
  if (ns && name && ns->is_string() && name->is_string())
    return *ns->as_string() + "/" + *name->as_string();
  const Json* uid = client.find("pod_uid");
  if (uid && uid->is_string()) return *uid->as_string();
  return "-";
}

void render_rows(const std::vector<Row>& rows, std::string& out, const std::string& indent) {
  if (rows.empty()) return;
  std::vector<std::size_t> widths(rows.front().size(), 0);
  for (const Row& row : rows) {
    for (std::size_t i = 0; i < row.size() && i < widths.size(); ++i) {
      widths[i] = std::max(widths[i], row[i].size());
    }
  }
  for (const Row& row : rows) {
    std::string line = indent;
    for (std::size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line.append(widths[i] - row[i].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
}

double number_of(const Json* value) { return value ? value->as_double().value_or(0) : 0; }

// Member `key` of `object` as an array; an empty one when absent or not an array.
const Json::Array& array_at(const Json& object, std::string_view key) {
  static const Json::Array kNone;
  const Json* value = object.find(key);
  const Json::Array* array = value ? value->as_array() : nullptr;
  return array ? *array : kNone;
}

std::optional<std::int64_t> id_of(const Json& client) {
  const Json* id = client.find("id");
  return id ? id->as_int64() : std::nullopt;
}

// Every client object of a status response, by id.
std::map<std::int64_t, const Json*> clients_by_id(const Json& status) {
  std::map<std::int64_t, const Json*> out;
  for (const Json& gpu : array_at(status, "gpus")) {
    for (const Json& c : array_at(gpu, "clients")) {
      if (auto id = id_of(c)) out[*id] = &c;
    }
  }
  return out;
}

struct PodRow {
  double held_ms = 0, memory_ms = 0, turn_ms = 0, quota_ms = 0, priority_ms = 0, out_bytes = 0,
         in_bytes = 0;
  bool rates = true;  // every client had a previous sample
  double allocated = 0, resident = 0;
  std::string cap = "none", limit = "none", priority = "normal";
  int clients = 0;
};

std::string rate_percent(double ms, double seconds, bool known) {
  if (!known || seconds <= 0) return "-";
  char out[32];
  std::snprintf(out, sizeof out, "%.1f%%", std::max(0.0, ms / (10 * seconds)));
  return out;
}

std::string rate_bytes(double bytes, double seconds, bool known) {
  if (!known || seconds <= 0) return "-";
  return format_bytes(static_cast<std::uint64_t>(std::max(0.0, bytes / seconds))) + "/s";
}

}  // namespace

std::string render_pod_table(const Json* previous, const Json& current, double seconds) {
  const std::map<std::int64_t, const Json*> before =
      previous ? clients_by_id(*previous) : std::map<std::int64_t, const Json*>{};
  std::map<std::pair<std::string, std::string>, PodRow> pods;  // (pod, gpu)
  for (const Json& gpu : array_at(current, "gpus")) {
    for (const Json& c : array_at(gpu, "clients")) {
      std::string pod = pod_of(c);
      if (pod == "-") pod = "pid " + text_of(c.find("pid"));
      PodRow& row = pods[{pod, text_of(gpu.find("uuid"))}];
      ++row.clients;
      row.allocated += number_of(c.find("allocated_bytes"));
      row.resident +=
          std::min(number_of(c.find("resident_bytes")), number_of(c.find("allocated_bytes")));
      const Json* limit = c.find("memory_limit_bytes");
      if (limit && !limit->is_null()) row.limit = bytes_of(limit);
      const Json* core = c.find("core_limit_percent");
      if (core && core->as_int64() != 100) row.cap = percent_of(core);
      if (const Json* priority = c.find("priority"); priority && priority->is_string()) {
        row.priority = *priority->as_string();
      }
      const auto id = id_of(c);
      const auto was = id ? before.find(*id) : before.end();
      if (was == before.end()) {
        row.rates = false;
        continue;
      }
      const Json& p = *was->second;
      const auto waited = [](const Json& j, const char* reason) {
        const Json* w = j.find("waited_by_reason_ms");
        return w ? number_of(w->find(reason)) : 0.0;
      };
      row.held_ms += number_of(c.find("held_ms")) - number_of(p.find("held_ms"));
      row.memory_ms += waited(c, "memory") - waited(p, "memory");
      row.turn_ms += waited(c, "turn") - waited(p, "turn");
      row.quota_ms += waited(c, "quota") - waited(p, "quota");
      row.priority_ms += waited(c, "priority") - waited(p, "priority");
      row.out_bytes +=
          number_of(c.find("swapped_out_bytes")) - number_of(p.find("swapped_out_bytes"));
      row.in_bytes += number_of(c.find("swapped_in_bytes")) - number_of(p.find("swapped_in_bytes"));
    }
  }
  if (pods.empty()) return "no clients\n";
  std::vector<Row> rows;
  rows.push_back({"POD", "GPU", "PROCS", "CLASS", "SHARE", "CAP", "WAIT MEM", "WAIT TURN",
                  "WAIT QUOTA", "WAIT CLASS", "MEMORY (ALLOC/ON GPU/LIMIT)", "SWAP OUT",
                  "SWAP IN"});
  for (const auto& [key, r] : pods) {
    const bool known = r.rates && previous != nullptr;
    rows.push_back(
        {key.first, key.second, std::to_string(r.clients), r.priority,
         rate_percent(r.held_ms, seconds, known), r.cap, rate_percent(r.memory_ms, seconds, known),
         rate_percent(r.turn_ms, seconds, known), rate_percent(r.quota_ms, seconds, known),
         rate_percent(r.priority_ms, seconds, known),
         format_bytes(static_cast<std::uint64_t>(r.allocated)) + " / " +
             format_bytes(static_cast<std::uint64_t>(r.resident)) + " / " + r.limit,
         rate_bytes(r.out_bytes, seconds, known), rate_bytes(r.in_bytes, seconds, known)});
  }
  std::string out;
  render_rows(rows, out, "");
  return out;
}

// A client's state as a user reads it: a holder giving its grant back after a revoke that asked for
// a swap-out is swapping out, and one past its grace then is late at it (it may be copying still)
// rather than plainly unresponsive.
std::string state_of(const Json& client) {
  const std::string state = text_of(client.find("state"));
  const Json* swapping = client.find("swapping_out");
  if (swapping == nullptr || !swapping->as_bool().value_or(false)) return state;
  if (state == "revoking") return "swapping-out";
  if (state == "unresponsive") return "late-swap-out";
  return state;
}

std::string render_status_table(const Json& status) {
  std::string out;
  const Json* gpus = status.find("gpus");
  const Json::Array* gpu_list = gpus ? gpus->as_array() : nullptr;
  const Json* scheduler = status.find("scheduler");
  const Json* known = scheduler != nullptr ? scheduler->find("gpus") : nullptr;
  const Json::Array* known_list = known != nullptr ? known->as_array() : nullptr;
  if (known_list != nullptr && known_list->empty()) {
    out +=
        "the scheduler knows no GPU: it refuses every client, which then runs unscheduled (its "
        "log says why; --gpus or the device plugin's set-gpus names the GPUs)\n";
  } else if (gpu_list == nullptr || gpu_list->empty()) {
    out += "no GPU has clients yet";
    if (known_list != nullptr) out += " (" + std::to_string(known_list->size()) + " known)";
    out += "\n";
  } else {
    for (const Json& gpu : *gpu_list) {
      const Json* virtual_capacity = gpu.find("capacity_virtual");
      const bool is_virtual = virtual_capacity && virtual_capacity->as_bool().value_or(false);
      out += "GPU " + text_of(gpu.find("uuid")) + "  mode " + text_of(gpu.find("mode")) +
             "  capacity " + bytes_of(gpu.find("capacity_bytes")) +
             (is_virtual ? " (virtual)" : "") + "  usable " + bytes_of(gpu.find("usable_bytes")) +
             "  running " + bytes_of(gpu.find("running_bytes")) + "  quantum " +
             duration_ms_of(gpu.find("quantum_ms")) + "  epoch " + text_of(gpu.find("last_epoch")) +
             "\n";
      std::vector<Row> rows;
      rows.push_back({"CLIENT", "PID", "POD", "PROCESS", "STATE", "WAITING", "MEMORY (ALLOC/LIMIT)",
                      "CORE (CAP/SHARE)", "CLASS"});
      const Json* clients = gpu.find("clients");
      if (clients && clients->as_array()) {
        for (const Json& c : *clients->as_array()) {
          const Json* limit = c.find("memory_limit_bytes");
          const std::string memory_limit =
              (limit == nullptr || limit->is_null()) ? "none" : bytes_of(limit);
          const Json* core = c.find("core_limit_percent");
          const std::string cap = (core && core->as_int64() == 100) ? "none" : percent_of(core);
          rows.push_back({text_of(c.find("id")), text_of(c.find("pid")), pod_of(c),
                          text_of(c.find("process")), state_of(c), text_of(c.find("waiting_for")),
                          bytes_of(c.find("allocated_bytes")) + " / " + memory_limit,
                          cap + " / " + percent_of(c.find("share_percent")),
                          text_of(c.find("priority"))});
        }
      }
      if (rows.size() == 1) {
        out += "  no clients\n";
      } else {
        render_rows(rows, out, "  ");
      }
    }
  }
  const Json* pods = status.find("pods");
  if (pods && pods->as_array() && !pods->as_array()->empty()) {
    out += "\nPods with limits set through the control API:\n";
    std::vector<Row> rows;
    rows.push_back({"POD UID", "NAME", "MEMORY LIMIT", "CORE LIMIT", "CLASS", "CLIENTS"});
    for (const Json& pod : *pods->as_array()) {
      const Json* ns = pod.find("namespace");
      const Json* name = pod.find("name");
      const std::string display = (ns && name && ns->is_string() && name->is_string())
                                      ? *ns->as_string() + "/" + *name->as_string()
                                      : "-";
      const Json* memory = pod.find("memory_limit_bytes");
      const Json* core = pod.find("core_limit_percent");
      std::string memory_text = "-";
      if (memory && !memory->is_null())
        memory_text = memory->as_int64() == 0 ? "none" : bytes_of(memory);
      std::string core_text = "-";
      if (core && !core->is_null()) core_text = core->as_int64() == 100 ? "none" : percent_of(core);
      const Json* priority = pod.find("priority");
      const std::string class_text =
          priority && priority->is_string() ? *priority->as_string() : "-";
      rows.push_back({text_of(pod.find("pod_uid")), display, memory_text, core_text, class_text,
                      text_of(pod.find("clients"))});
    }
    render_rows(rows, out, "  ");
  }
  return out;
}

}  // namespace nvshare::tools
