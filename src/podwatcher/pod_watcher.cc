#include "podwatcher/pod_watcher.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <mutex>
#include <optional>
#include <random>
#include <thread>

#include "common/clock.h"
#include "common/log.h"
#include "common/unix_socket.h"
#include "control/client.h"
#include "podwatcher/api_client.h"
#include "podwatcher/limits_ledger.h"
#include "podwatcher/pod_alerts.h"
#include "podwatcher/pod_limits.h"
#include "podwatcher/watch_stream.h"

namespace nvshare::podwatcher {
namespace {

using std::chrono::milliseconds;

constexpr const char* kComponent = "nvshare-device-plugin";
constexpr const char* kInvalidReason = "InvalidNvshareAnnotation";

// Percent-encodes a query value (node names are DNS labels, but stay correct for anything).
std::string query_escape(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : text) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

std::string now_rfc3339() {
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return text;
}

// Capped exponential backoff with jitter: each wait is drawn from [step/2, step], and the step
// doubles up to the cap.
class Backoff {
 public:
  Backoff(milliseconds initial, milliseconds cap)
      : initial_(std::max(initial, milliseconds(1))),
        cap_(std::max(cap, initial_)),
        step_(initial_) {}
  milliseconds next() {
    std::uniform_int_distribution<std::int64_t> draw(step_.count() / 2, step_.count());
    const milliseconds wait(draw(rng_));
    step_ = std::min(cap_, step_ * 2);
    return wait;
  }
  void reset() { step_ = initial_; }

 private:
  milliseconds initial_;
  milliseconds cap_;
  milliseconds step_;
  std::mt19937_64 rng_{std::random_device{}()};
};

struct PendingWarning {
  std::string pod_uid;
  std::string namespace_name;
  std::string name;
  std::string message;
  std::string reason = kInvalidReason;
};

}  // namespace

struct PodWatcher::Impl {
  explicit Impl(PodWatcherConfig c) : config(std::move(c)), alerts(config.alerts) {}

  PodWatcherConfig config;
  PodAlerts alerts;  // guarded by mu
  std::optional<ApiCredentials> credentials;
  std::unique_ptr<ApiClient> watch_api;  // used by the watch thread only
  std::unique_ptr<ApiClient> post_api;   // used by the sync thread only
  std::thread watch_thread;
  std::thread sync_thread;
  std::atomic<bool> stopping{false};
  bool started = false;

  mutable std::mutex mu;
  std::condition_variable wake;         // changes for the sync thread; stop for both
  LimitsLedger ledger;                  // guarded by mu
  std::deque<PendingWarning> warnings;  // guarded by mu
  PodWatcherStats stats;                // guarded by mu
  // "namespace/name" of each pod in the ledger, and the order in which their events were handled
  // (the later of two pods with one name is the live one). Guarded by mu.
  struct PodKey {
    std::string key;
    std::uint64_t sequence = 0;
  };
  std::map<std::string, PodKey> pod_keys;  // by UID
  std::uint64_t pod_key_sequence = 0;

  // Watch-thread state.
  struct TrackedPod {
    PodLimits limits;
    std::map<std::string, std::string> warned;  // annotation -> value already reported
  };
  std::map<std::string, TrackedPod> tracked;  // managed pods by UID
  std::string resource_version;

  // Sleeps up to `wait` unless stopping; returns false when stopping.
  bool sleep_for(milliseconds wait) {
    std::unique_lock lock(mu);
    wake.wait_for(lock, wait, [&] { return stopping.load(); });
    return !stopping;
  }

  void count(std::uint64_t PodWatcherStats::*field) {
    std::lock_guard lock(mu);
    ++(stats.*field);
  }

  // ---- the watch thread -------------------------------------------------------------------------

  std::string pods_path() const {
    return "/api/v1/pods?fieldSelector=" + query_escape("spec.nodeName=" + config.node_name);
  }

  void set_resource_version(const std::string& version) {
    if (version.empty()) return;
    resource_version = version;
    std::lock_guard lock(mu);
    stats.resource_version = version;
  }

  void forget(const std::string& uid) {
    if (tracked.erase(uid) == 0) return;
    {
      std::lock_guard lock(mu);
      ledger.remove(uid);
      pod_keys.erase(uid);
    }
    wake.notify_all();
  }

  void handle_pod(const Json& object) {
    auto parsed = parse_pod(object, config.resource_name);
    if (!parsed) {
      NVSHARE_WARN("pod watcher: ignoring a pod object: %s", parsed.error().message.c_str());
      return;
    }
    const PodView& pod = parsed.value();
    if (pod.node_name != config.node_name || pod.finished() || !pod.requests_resource) {
      forget(pod.uid);
      return;
    }
    auto [it, inserted] = tracked.try_emplace(pod.uid);
    TrackedPod& state = it->second;
    LimitsDecision decision = decide_limits(pod, state.limits);
    std::vector<PendingWarning> new_warnings;
    for (const char* annotation : {kMemoryLimitAnnotation.data(), kCoreLimitAnnotation.data()}) {
      auto problem =
          std::find_if(decision.problems.begin(), decision.problems.end(),
                       [&](const AnnotationProblem& p) { return p.annotation == annotation; });
      if (problem == decision.problems.end()) {
        state.warned.erase(annotation);
        continue;
      }
      auto warned = state.warned.find(annotation);
      if (warned != state.warned.end() && warned->second == problem->value) continue;
      state.warned[annotation] = problem->value;
      NVSHARE_WARN("pod %s/%s: %s", pod.namespace_name.c_str(), pod.name.c_str(),
                   problem->message.c_str());
      new_warnings.push_back(
          PendingWarning{pod.uid, pod.namespace_name, pod.name, problem->message});
      count(&PodWatcherStats::invalid_annotations);
    }
    // Only a change (or a new pod, or a warning to post) needs the sync thread.
    const bool changed = inserted || state.limits != decision.limits;
    state.limits = decision.limits;
    {
      std::lock_guard lock(mu);
      ledger.set_desired(pod.uid, pod.namespace_name, pod.name, decision.limits);
      pod_keys[pod.uid] = PodKey{pod.namespace_name + "/" + pod.name, ++pod_key_sequence};
      for (auto& warning : new_warnings) warnings.push_back(std::move(warning));
    }
    if (changed || !new_warnings.empty()) wake.notify_all();
  }

  // Lists the pods; on success the tracked set matches the list and the watch starts from its
  // resourceVersion.
  bool list_pods() {
    HttpResponse response;
    HttpFailure failure;
    if (!watch_api->request("GET", pods_path(), "", &response, &failure)) {
      if (!failure.interrupted) NVSHARE_WARN("pod watcher: list pods: %s", failure.message.c_str());
      count(&PodWatcherStats::api_errors);
      return false;
    }
    if (response.status != 200) {
      ApiStatus status = parse_api_status_text(response.body);
      NVSHARE_WARN("pod watcher: list pods: HTTP %ld %s", response.status, status.message.c_str());
      count(&PodWatcherStats::api_errors);
      return false;
    }
    auto list = parse_pod_list(response.body);
    if (!list) {
      NVSHARE_WARN("pod watcher: list pods: %s", list.error().message.c_str());
      count(&PodWatcherStats::api_errors);
      return false;
    }
    std::map<std::string, bool> listed;
    for (const Json& item : list.value().items) {
      auto pod = parse_pod(item, config.resource_name);
      if (pod) listed[pod.value().uid] = true;
      handle_pod(item);
    }
    std::vector<std::string> gone;
    for (const auto& [uid, state] : tracked) {
      if (!listed.contains(uid)) gone.push_back(uid);
    }
    for (const auto& uid : gone) forget(uid);
    set_resource_version(list.value().resource_version);
    {
      std::lock_guard lock(mu);
      ++stats.lists;
      stats.synced = true;
    }
    NVSHARE_INFO("pod watcher: listed %zu pods on node %s (%zu managed), resourceVersion %s",
                 list.value().items.size(), config.node_name.c_str(), tracked.size(),
                 resource_version.c_str());
    return true;
  }

  enum class WatchEnd { kEnded, kGone, kFailed, kStopped };

  WatchEnd watch_once(bool* saw_events) {
    const std::string path =
        pods_path() + "&watch=1&resourceVersion=" + query_escape(resource_version) +
        "&allowWatchBookmarks=true&timeoutSeconds=" + std::to_string(config.watch_timeout.count());
    LineSplitter splitter;
    WatchEnd end = WatchEnd::kEnded;
    std::string stream_error;
    auto on_line = [&](std::string_view line) -> bool {
      auto event = parse_watch_event(line);
      if (!event) {
        stream_error = event.error().message;
        end = WatchEnd::kFailed;
        return false;
      }
      *saw_events = true;
      count(&PodWatcherStats::events_seen);
      WatchEvent& e = event.value();
      switch (e.type) {
        case WatchEvent::Type::kAdded:
        case WatchEvent::Type::kModified:
          handle_pod(e.object);
          break;
        case WatchEvent::Type::kDeleted: {
          auto pod = parse_pod(e.object, config.resource_name);
          if (pod) forget(pod.value().uid);
          break;
        }
        case WatchEvent::Type::kBookmark:
          break;
        case WatchEvent::Type::kError:
          if (e.error_code == 410) {
            end = WatchEnd::kGone;
          } else {
            stream_error = "ERROR event " + std::to_string(e.error_code) + " " + e.error_message;
            end = WatchEnd::kFailed;
          }
          return false;
      }
      set_resource_version(e.resource_version);
      return true;
    };
    auto on_data = [&](std::string_view bytes) -> bool {
      Status fed = splitter.feed(bytes, on_line);
      if (!fed) {
        stream_error = fed.error().message;
        end = WatchEnd::kFailed;
        return false;
      }
      return end == WatchEnd::kEnded;
    };
    HttpResponse response;
    HttpFailure failure;
    const milliseconds stream_timeout = config.watch_timeout + std::chrono::seconds(60);
    const bool completed = watch_api->stream(path, stream_timeout, on_data, &response, &failure);
    if (!completed) {
      if (failure.interrupted) return WatchEnd::kStopped;
      NVSHARE_INFO("pod watcher: watch from %s ended: %s", resource_version.c_str(),
                   failure.message.c_str());
      count(&PodWatcherStats::api_errors);
      return WatchEnd::kFailed;
    }
    if (response.status == 410) return WatchEnd::kGone;
    if (response.status != 200) {
      ApiStatus status = parse_api_status_text(response.body);
      if (status.code == 410) return WatchEnd::kGone;
      NVSHARE_WARN("pod watcher: watch: HTTP %ld %s", response.status, status.message.c_str());
      count(&PodWatcherStats::api_errors);
      return WatchEnd::kFailed;
    }
    count(&PodWatcherStats::watches);
    if (end == WatchEnd::kFailed) {
      NVSHARE_WARN("pod watcher: watch stream: %s", stream_error.c_str());
      count(&PodWatcherStats::api_errors);
    }
    return end;
  }

  void watch_loop() {
    Backoff backoff(config.backoff_initial, config.backoff_max);
    bool need_list = true;
    bool watched_before = false;
    while (!stopping) {
      if (need_list) {
        if (!list_pods()) {
          if (!sleep_for(backoff.next())) return;
          continue;
        }
        need_list = false;
      }
      if (watched_before) count(&PodWatcherStats::watch_restarts);
      watched_before = true;
      bool saw_events = false;
      const auto began = std::chrono::steady_clock::now();
      switch (watch_once(&saw_events)) {
        case WatchEnd::kStopped:
          return;
        case WatchEnd::kGone:
          NVSHARE_INFO("pod watcher: resourceVersion %s is too old (410 Gone); relisting",
                       resource_version.c_str());
          count(&PodWatcherStats::relists_gone);
          need_list = true;
          // A relist normally fixes this at once; repeated Gone answers back off.
          if (saw_events) backoff.reset();
          if (!saw_events && !sleep_for(backoff.next())) return;
          break;
        case WatchEnd::kEnded:
          // The server closed a healthy watch (its timeout): resume at once. A watch that keeps
          // ending immediately with nothing in it backs off instead of spinning.
          if (saw_events || std::chrono::steady_clock::now() - began > std::chrono::seconds(1)) {
            backoff.reset();
          } else if (!sleep_for(backoff.next())) {
            return;
          }
          break;
        case WatchEnd::kFailed:
          if (saw_events) backoff.reset();
          if (!sleep_for(backoff.next())) return;
          break;
      }
    }
  }

  // ---- the sync thread: control-socket pushes and Warning Events ------------------------------

  void post_warning(const PendingWarning& warning) {
    const std::string now = now_rfc3339();
    Json event(Json::Object{
        {"apiVersion", "v1"},
        {"kind", "Event"},
        {"metadata",
         Json::Object{{"generateName", warning.name + "."}, {"namespace", warning.namespace_name}}},
        {"involvedObject", Json::Object{{"apiVersion", "v1"},
                                        {"kind", "Pod"},
                                        {"name", warning.name},
                                        {"namespace", warning.namespace_name},
                                        {"uid", warning.pod_uid}}},
        {"reason", warning.reason},
        {"message", warning.message},
        {"type", "Warning"},
        {"source", Json::Object{{"component", kComponent}, {"host", config.node_name}}},
        {"reportingComponent", kComponent},
        {"reportingInstance", config.node_name},
        {"firstTimestamp", now},
        {"lastTimestamp", now},
        {"count", 1},
    });
    HttpResponse response;
    HttpFailure failure;
    const std::string path = "/api/v1/namespaces/" + warning.namespace_name + "/events";
    if (!post_api->request("POST", path, event.dump(), &response, &failure)) {
      if (!failure.interrupted) {
        NVSHARE_WARN("pod watcher: cannot post an event on %s/%s: %s",
                     warning.namespace_name.c_str(), warning.name.c_str(), failure.message.c_str());
      }
      return;
    }
    if (response.status != 201 && response.status != 200) {
      NVSHARE_WARN("pod watcher: posting an event on %s/%s: HTTP %ld %s",
                   warning.namespace_name.c_str(), warning.name.c_str(), response.status,
                   response.body.substr(0, 200).c_str());
      return;
    }
    count(&PodWatcherStats::warnings_posted);
  }

  // Sends one command; false when the scheduler could not be reached (the connection is dropped).
  bool push(std::optional<control::ControlClient>& control, const ControlCommand& command) {
    const int timeout_ms = static_cast<int>(config.control_timeout.count());
    if (!control) {
      auto connected = control::ControlClient::connect(config.control_socket, timeout_ms);
      if (!connected) {
        NVSHARE_DEBUG("pod watcher: %s", connected.error().message.c_str());
        return false;
      }
      control.emplace(std::move(connected.value()));
    }
    auto response = control->call(command.to_request());
    if (!response) {
      NVSHARE_INFO("pod watcher: control socket: %s", response.error().message.c_str());
      control.reset();
      return false;
    }
    auto refusal = control::decode_refusal(response.value());
    if (refusal && !refusal.value()) {
      count(&PodWatcherStats::pushes);
      return true;
    }
    const std::string message = refusal ? refusal.value()->error : refusal.error().message;
    if (command.kind == ControlCommand::Kind::kForgetPod) {
      // Not remembered: the scheduler restarted since, which is what forgetting wanted anyway.
      NVSHARE_DEBUG("pod watcher: forget-pod %s: %s", command.pod_uid.c_str(), message.c_str());
      return true;
    }
    // A refusal is not retried: the same request would be refused again.
    NVSHARE_WARN("pod watcher: the scheduler refused limits for pod %s/%s: %s",
                 command.namespace_name.c_str(), command.name.c_str(), message.c_str());
    count(&PodWatcherStats::push_failures);
    return true;
  }

  // Reads the scheduler's status and posts the Warning Events it calls for on managed pods
  // (pod_alerts.h). False when the scheduler could not be reached.
  bool check_alerts(std::optional<control::ControlClient>& control) {
    if (!control) return false;
    auto response = control->call(control::StatusRequest{});
    if (!response) {
      control.reset();
      return false;
    }
    auto reply = control::decode_reply<control::StatusAnswer>(response.value());
    if (!reply || reply.value().refused()) return true;  // an older scheduler: nothing to read
    std::vector<PodUsage> usage = pod_usage_from_status(reply.value().answer().body);
    std::vector<PendingWarning> posts;
    {
      std::lock_guard lock(mu);
      ++stats.status_reads;
      std::erase_if(usage, [&](const PodUsage& u) { return pod_keys.count(u.pod_uid) == 0; });
      const std::uint64_t suppressed = alerts.suppressed();
      for (PodAlert& alert : alerts.observe(usage, SteadyClock::instance().now())) {
        const std::string& key = pod_keys.at(alert.pod_uid).key;
        const std::size_t slash = key.find('/');
        posts.push_back(PendingWarning{alert.pod_uid, key.substr(0, slash), key.substr(slash + 1),
                                       std::move(alert.message), std::move(alert.reason)});
        ++stats.alerts_raised;
      }
      stats.alerts_suppressed += alerts.suppressed() - suppressed;
    }
    for (const PendingWarning& warning : posts) {
      if (stopping) break;
      NVSHARE_WARN("pod %s/%s: %s: %s", warning.namespace_name.c_str(), warning.name.c_str(),
                   warning.reason.c_str(), warning.message.c_str());
      post_warning(warning);
    }
    return true;
  }

  // A cheap request on an idle connection: a restarted scheduler shows up as a failed call.
  bool check(std::optional<control::ControlClient>& control) {
    if (!control) return false;
    if (control->call(control::VersionRequest{})) return true;
    control.reset();
    return false;
  }

  // Tells the scheduler that every limit this watcher holds has been pushed: its limits are
  // authoritative from now on (scheduler.h). False when it could not be reached.
  bool announce_sync(std::optional<control::ControlClient>& control) {
    const int timeout_ms = static_cast<int>(config.control_timeout.count());
    if (!control) {
      auto connected = control::ControlClient::connect(config.control_socket, timeout_ms);
      if (!connected) return false;
      control.emplace(std::move(connected.value()));
    }
    auto response = control->call(control::SyncRequest{});
    if (!response) {
      control.reset();
      return false;
    }
    return true;  // an older scheduler without "sync" refuses it: nothing to wait for either
  }

  void sync_loop() {
    using namespace std::chrono_literals;
    // How often the control socket's identity is looked at: a restarted scheduler gets every limit
    // again within about this long.
    constexpr auto kIdentityPoll = 200ms;
    Backoff backoff(config.backoff_initial, config.backoff_max);
    std::optional<control::ControlClient> control;
    bool reachable = true;  // the last attempt reached the scheduler
    std::optional<FileIdentity> scheduler = socket_identity(config.control_socket);
    bool sync_announced = false;  // to this scheduler, after a full push
    auto next_check = std::chrono::steady_clock::now() + config.control_check_interval;
    auto next_status = std::chrono::steady_clock::now() + config.status_interval;
    while (!stopping) {
      if (const auto now_serving = socket_identity(config.control_socket);
          now_serving && now_serving != scheduler) {
        if (scheduler) {
          NVSHARE_INFO("pod watcher: a new scheduler at %s: pushing every limit again",
                       config.control_socket.c_str());
        }
        scheduler = now_serving;
        control.reset();
        sync_announced = false;
        std::lock_guard lock(mu);
        ledger.mark_all_unpushed();
      }
      std::deque<PendingWarning> to_post;
      {
        std::lock_guard lock(mu);
        to_post.swap(warnings);
      }
      for (const auto& warning : to_post) {
        if (stopping) return;
        post_warning(warning);
      }

      bool failed = false;
      while (!stopping) {
        std::optional<ControlCommand> command;
        {
          std::lock_guard lock(mu);
          command = ledger.next_command();
        }
        if (!command) break;
        if (!push(control, *command)) {
          failed = true;
          break;
        }
        if (!reachable) NVSHARE_INFO("pod watcher: the scheduler is reachable again");
        reachable = true;
        std::lock_guard lock(mu);
        ledger.mark_done(*command);
      }
      if (stopping) return;
      bool listed;
      {
        std::lock_guard lock(mu);
        listed = stats.synced;
      }
      if (!failed && !sync_announced && listed) {
        // Every pod on the node has been listed and pushed to this scheduler.
        if (announce_sync(control)) {
          sync_announced = true;
        } else {
          failed = true;
        }
      }
      if (failed) {
        sync_announced = false;
        {
          std::lock_guard lock(mu);
          ++stats.push_failures;
          // Whatever the scheduler had may be gone by the time it answers again.
          ledger.mark_all_unpushed();
        }
        if (reachable) {
          NVSHARE_WARN("pod watcher: cannot reach the scheduler at %s; retrying with backoff",
                       config.control_socket.c_str());
        }
        reachable = false;
        std::unique_lock lock(mu);
        wake.wait_for(lock, std::min<std::chrono::milliseconds>(backoff.next(), kIdentityPoll * 5),
                      [&] { return stopping.load() || !warnings.empty(); });
        continue;
      }
      backoff.reset();

      const auto now = std::chrono::steady_clock::now();
      bool has_pods;
      {
        std::lock_guard lock(mu);
        has_pods = ledger.managed_pods() > 0;
      }
      if (config.status_interval.count() > 0 && now >= next_status) {
        next_status = now + config.status_interval;
        if (has_pods && !check_alerts(control)) continue;  // unreachable: the next pass retries
      }
      if (now >= next_check) {
        next_check = now + config.control_check_interval;
        if (has_pods && !check(control)) {
          sync_announced = false;
          std::lock_guard lock(mu);
          ledger.mark_all_unpushed();
          continue;
        }
      }
      std::unique_lock lock(mu);
      const auto next_due =
          config.status_interval.count() > 0 ? std::min(next_check, next_status) : next_check;
      wake.wait_until(lock, std::min(next_due, now + kIdentityPoll), [&] {
        return stopping.load() || !warnings.empty() || ledger.next_command().has_value();
      });
    }
  }
};

PodWatcher::PodWatcher(PodWatcherConfig config)
    : impl_(std::make_unique<Impl>(std::move(config))) {}

PodWatcher::~PodWatcher() { stop(); }

Status PodWatcher::start() {
  Impl& impl = *impl_;
  if (impl.started) return make_error("the pod watcher is already started");
  const PodWatcherConfig& config = impl.config;
  if (config.node_name.empty()) {
    return make_error("the pod watcher needs a node name (--node-name or NODE_NAME)");
  }
  if (config.watch_timeout.count() < 1 || config.watch_timeout.count() > 86400) {
    return make_error("watch-timeout must be between 1s and 86400s, got " +
                      std::to_string(config.watch_timeout.count()) + "s");
  }
  if (config.resource_name.empty()) return make_error("the resource name is empty");
  if (config.control_socket.empty()) return make_error("the control socket path is empty");
  auto credentials = config.kubeconfig_path.empty()
                         ? in_cluster_credentials(config.in_cluster_host, config.in_cluster_port,
                                                  config.service_account_dir)
                         : load_kubeconfig(config.kubeconfig_path);
  if (!credentials) return credentials.error();
  impl.credentials = credentials.value();
  const std::string agent = std::string(kComponent) + "/pod-watcher";
  impl.watch_api =
      std::make_unique<ApiClient>(credentials.value(), config.api_request_timeout, agent);
  impl.post_api =
      std::make_unique<ApiClient>(credentials.value(), config.api_request_timeout, agent);
  impl.started = true;
  NVSHARE_INFO("pod watcher: watching pods on node %s at %s; limits go to %s",
               config.node_name.c_str(), credentials.value().server.c_str(),
               config.control_socket.c_str());
  impl.watch_thread = std::thread([&impl] { impl.watch_loop(); });
  impl.sync_thread = std::thread([&impl] { impl.sync_loop(); });
  return Status::Ok();
}

void PodWatcher::stop() {
  Impl& impl = *impl_;
  {
    std::lock_guard lock(impl.mu);
    impl.stopping = true;
  }
  impl.wake.notify_all();
  if (impl.watch_api) impl.watch_api->interrupt();
  if (impl.post_api) impl.post_api->interrupt();
  if (impl.watch_thread.joinable()) impl.watch_thread.join();
  if (impl.sync_thread.joinable()) impl.sync_thread.join();
}

std::map<std::string, std::uint64_t> PodWatcher::memory_limits_by_pod_uid() const {
  std::lock_guard lock(impl_->mu);
  return impl_->ledger.memory_limits();
}

std::optional<PodLimits> PodWatcher::limits_for_pod_name(const std::string& key) const {
  std::lock_guard lock(impl_->mu);
  if (!impl_->stats.synced) return std::nullopt;
  const std::string* found = nullptr;
  std::uint64_t newest = 0;
  for (const auto& [uid, pod_key] : impl_->pod_keys) {
    if (pod_key.key != key || (found != nullptr && pod_key.sequence < newest)) continue;
    found = &uid;
    newest = pod_key.sequence;
  }
  if (found == nullptr) return std::nullopt;
  return impl_->ledger.desired(*found).value_or(PodLimits{});
}

std::map<std::string, std::uint64_t> PodWatcher::memory_limits_by_pod_name() const {
  std::lock_guard lock(impl_->mu);
  std::map<std::string, std::uint64_t> limits;
  std::map<std::string, std::uint64_t> winner;  // key -> sequence of the pod that holds it
  for (const auto& [uid, key] : impl_->pod_keys) {
    auto [it, inserted] = winner.try_emplace(key.key, key.sequence);
    if (!inserted && it->second > key.sequence) continue;
    it->second = key.sequence;
    // A later pod without a memory limit hides the earlier one's: the name now means that pod.
    limits.erase(key.key);
    if (auto desired = impl_->ledger.desired(uid); desired && desired->memory_bytes) {
      limits[key.key] = *desired->memory_bytes;
    }
  }
  return limits;
}

std::map<std::string, int> PodWatcher::core_limits_by_pod_uid() const {
  std::lock_guard lock(impl_->mu);
  return impl_->ledger.core_limits();
}

PodWatcherStats PodWatcher::stats() const {
  std::lock_guard lock(impl_->mu);
  PodWatcherStats stats = impl_->stats;
  stats.managed_pods = impl_->ledger.managed_pods();
  return stats;
}

}  // namespace nvshare::podwatcher
