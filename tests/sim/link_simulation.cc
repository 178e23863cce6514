#include "link_simulation.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <set>
#include <sstream>
#include <tuple>

#include "client/link/grant_session.h"
#include "rng.h"
#include "scheduler/scheduler.h"

namespace nvshare::linksim {
namespace {

using namespace std::chrono_literals;
using client::GrantSession;
using client::GrantState;
using client::SessionConfig;
using scheduler::ClientId;
namespace session = client::session;

const MonoTime kStart = MonoTime{std::chrono::hours(1)};
constexpr std::uint64_t kMaxStepsAtOneInstant = 100000;
// Application threads keep about this much GPU work queued (they synchronize beyond it).
constexpr Duration kQueueAhead = 4ms;
// How often the limits and the waits are looked at when nothing else happens.
constexpr Duration kCheckEvery = 50ms;
// From the gate opening to a waiting application thread running again.
constexpr Duration kWakeLatency = 20us;

std::string pod_uid(int pod) {
  char text[40];
  std::snprintf(text, sizeof text, "00000000-0000-4000-8000-%012d", pod + 1);
  return text;
}

std::string gpu_uuid(int gpu) { return "GPU-sim-" + std::to_string(gpu); }

Duration transfer_time(std::uint64_t bytes, double bytes_per_s) {
  return Duration(static_cast<std::int64_t>(static_cast<double>(bytes) / bytes_per_s * 1e9));
}

class World;

// One connection between a client engine and the scheduler.
struct Connection {
  int client = 0;
  int incarnation = 0;         // the scheduler's life it belongs to
  bool scheduler_open = true;  // the scheduler has not closed or lost it
  ClientId id = 0;             // the scheduler's id, once the hello was handled
  MonoTime last_to_scheduler{};
  MonoTime last_to_client{};
};

// One simulated process on one GPU: its application thread, the link shell's side effects, and
// the real engine.
class SimClient final : public client::SessionProbe {
 public:
  SimClient(World& world, int index, const ClientSpec& spec)
      : world_(world), index(index), spec(spec) {}

  int waiters() override { return waiting ? 1 : 0; }
  MonoTime waiting_since() override { return wait_since; }
  std::uint64_t inside() override { return in_launch ? 1 : 0; }
  Duration idle_for() override;
  client::DeviceUsage usage() override { return {spec.bytes, spec.bytes - on_host, 0}; }
  Duration queue_waited() override { return Duration{0}; }
  std::uint64_t at_bound() override { return at_bound_now ? 1 : 0; }

  World& world_;
  const int index;
  const ClientSpec spec;
  std::unique_ptr<GrantSession> engine;
  bool alive = false;
  bool gone = false;
  // What the shell published.
  bool gate_open = false;
  GrantState state = GrantState::kStarting;
  std::uint64_t held_epoch = 0;
  // The application thread.
  bool waiting = false;
  MonoTime wait_since{};
  bool in_launch = false;
  bool at_bound_now = false;  // waiting for the drain bound (outside the gate)
  MonoTime work_end{};
  MonoTime last_submit{};
  int burst_left = 0;
  Duration worked_since_pause{0};
  Duration worked_since_stall{0};
  Duration worked{0};
  bool paused_once = false;
  std::uint64_t noticed_epoch = 0;  // the grant its last swap notice or contended came for
  std::uint64_t yield_epoch = 0;    // the grant its last yield came for
  // Of spec.bytes, what is on the host; it moves in pieces of a quarter, as the library moves a
  // large allocation's pieces.
  std::uint64_t on_host = 0;
  bool swapped() const { return on_host > 0; }
  std::uint64_t piece() const { return std::max<std::uint64_t>(1, spec.bytes / 4); }
  // What a swap-out asked for `target` (0: all) moves: whole pieces, at least the target.
  std::uint64_t to_move_out(std::uint64_t target) const {
    const std::uint64_t there = spec.bytes - on_host;
    if (target == 0) return there;
    return std::min(there, (target + piece() - 1) / piece() * piece());
  }
  // What a swap-in limited to `limit` (0: none) brings back: whole pieces within it.
  std::uint64_t to_move_in(std::uint64_t limit) const {
    if (limit == 0) return on_host;
    return std::min(on_host, limit / piece() * piece());
  }
  bool limits_unknown = false;  // the agent refuses allocations until limits come
  bool unreachable = false;     // its engine was told the scheduler is gone; no welcome since
  // The link.
  std::uint64_t connection = 0;  // 0: none
  MonoTime registered_at{};
  std::uint64_t tick_generation = 0;
  std::optional<MonoTime> tick_at;
  int revokes = 0;
  bool hung = false;
  std::optional<MonoTime> release_due;
  std::uint64_t revoked_epoch = 0;
};

class World final : public scheduler::ClientChannel {
 public:
  World(const Scenario& scenario, bool trace)
      : sc_(scenario), rng_(scenario.seed ^ 0x51u), tracing_(trace) {}

  Result run();
  MonoTime now() const { return now_; }

  // ClientChannel: a frame from the scheduler to a client.
  void send(ClientId id, const protocol::Message& message) override {
    auto it = by_id_.find(id);
    if (it == by_id_.end()) return;
    const std::uint64_t cid = it->second;
    Connection& c = connections_.at(cid);
    if (!c.scheduler_open) return;
    const MonoTime at = std::max(c.last_to_client, now_ + delay());
    c.last_to_client = at;
    at_time(at, [this, cid, message] { deliver_to_client(cid, message); });
  }

 private:
  struct Step {
    MonoTime at;
    std::uint64_t seq;
    std::function<void()> fn;
    bool operator>(const Step& o) const { return std::tie(at, seq) > std::tie(o.at, o.seq); }
  };

  Duration delay() { return rng_.between(Duration{0}, sc_.delay_max); }
  void at_time(MonoTime at, std::function<void()> fn) {
    queue_.push(Step{std::max(at, now_), seq_++, std::move(fn)});
  }
  void trace(const std::string& line) {
    if (!tracing_) return;
    std::ostringstream s;
    s << "t=" << to_ms(now_ - kStart) << "ms " << line;
    trace_.push_back(s.str());
    if (trace_.size() > 400) trace_.pop_front();
  }
  void fail(const std::string& why) {
    if (!result_.ok) return;
    result_.ok = false;
    result_.failure = "t=" + std::to_string(to_ms(now_ - kStart)) + "ms: " + why;
  }

  // ---- the scheduler side
  void start_scheduler(const std::optional<scheduler::SchedulerState>& state);
  void schedule_scheduler_tick();
  void deliver_to_scheduler(std::uint64_t cid, const protocol::Message& message);
  void scheduler_disconnect(std::uint64_t cid);
  void restart(Duration down);
  void change_limits();

  // ---- the client side
  SessionConfig session_config(const SimClient& c) const;
  void start_client(SimClient& c);
  void exit_client(SimClient& c);
  void feed(SimClient& c, const session::Event& event);
  void perform(SimClient& c, const session::Action& action);
  void publish(SimClient& c, const session::Publish& p);
  void reschedule_tick(SimClient& c);
  void deliver_to_client(std::uint64_t cid, const protocol::Message& message);
  void drop(SimClient& c);
  // The client closes its socket; the scheduler notices a delay later.
  void close_from_client(SimClient& c);
  void submit(SimClient& c);
  bool done_working(const SimClient& c) const;
  void record_idle_release(const SimClient& c, std::uint64_t epoch);
  void launch_done(SimClient& c);

  // ---- properties
  void check_step();
  // Holders of GPU `gpu` the scheduler declared unresponsive: how many, and their memory.
  std::pair<int, std::uint64_t> unresponsive_holders(int gpu) const;
  void check_limits_applied(const SimClient& c, const protocol::Limits& limits);
  void check_limits_current();
  Duration stuck_bound() const;

  const Scenario sc_;
  sim::Rng rng_;
  const bool tracing_;
  std::deque<std::string> trace_;
  Result result_;
  MonoTime now_ = kStart;
  std::uint64_t seq_ = 0;
  std::priority_queue<Step, std::vector<Step>, std::greater<>> queue_;

  std::unique_ptr<scheduler::Scheduler> scheduler_;
  int incarnation_ = 0;
  MonoTime down_until_ = kStart;
  std::uint64_t scheduler_tick_generation_ = 0;
  std::optional<MonoTime> scheduler_tick_at_;
  std::map<ClientId, std::uint64_t> by_id_;
  std::map<std::uint64_t, Connection> connections_;
  std::uint64_t next_connection_ = 1;

  std::vector<std::unique_ptr<SimClient>> clients_;
  std::vector<std::vector<Limits>> pod_history_;
  std::vector<Limits> pod_limits_;
  std::vector<MonoTime> pod_changed_;
  std::map<std::tuple<int, int, std::uint64_t>, int> epoch_holder_;  // (life, gpu, epoch)
};

Duration SimClient::idle_for() {
  const MonoTime now = world_.now();
  // As the library's tracker: a submission counts once its call returns, whatever the call took.
  if (work_end > now) return Duration{0};
  return now - std::max(work_end, last_submit);
}

// ---- the scheduler side -------------------------------------------------------------------------

void World::start_scheduler(const std::optional<scheduler::SchedulerState>& state) {
  scheduler::DaemonConfig config;
  config.policy = sc_.config;
  scheduler_ = std::make_unique<scheduler::Scheduler>(config, *this);
  scheduler_->set_process_probe([this](pid_t pid, std::uint64_t) {
    const int index = static_cast<int>(pid) - 1000;
    return index >= 0 && index < static_cast<int>(clients_.size()) && !clients_[index]->gone;
  });
  ++incarnation_;
  by_id_.clear();
  if (state) {
    scheduler_->restore(*state, true, now_);
  } else {
    std::vector<GpuInfo> gpus;
    for (int g = 0; g < sc_.gpus; ++g)
      gpus.push_back(GpuInfo{gpu_uuid(g), static_cast<unsigned>(g), sc_.gpu_bytes});
    (void)scheduler_->set_gpus(gpus, "simulation", now_);
    // The device plugin pushes every pod's limits, then says it has.
    for (std::size_t p = 0; p < pod_limits_.size(); ++p) {
      scheduler::Selector selector;
      selector.pod_uid = pod_uid(static_cast<int>(p));
      scheduler::LimitsChange change;
      change.memory = {scheduler::FieldChange::Op::kSet, pod_limits_[p].memory_bytes};
      change.core = {scheduler::FieldChange::Op::kSet, pod_limits_[p].core_percent};
      if (pod_limits_[p].priority != Limits::kNoPriority) {
        change.priority = {scheduler::FieldChange::Op::kSet, pod_limits_[p].priority};
      }
      if (auto r = scheduler_->set_limits(selector, change, now_); !r) fail(r.error().message);
    }
    scheduler_->mark_synced(now_);
  }
  schedule_scheduler_tick();
}

void World::schedule_scheduler_tick() {
  const std::optional<MonoTime> due = scheduler_->next_deadline();
  if (due == scheduler_tick_at_) return;
  scheduler_tick_at_ = due;
  if (!due) return;
  const std::uint64_t generation = ++scheduler_tick_generation_;
  at_time(*due, [this, generation] {
    if (generation != scheduler_tick_generation_) return;
    scheduler_tick_at_.reset();
    scheduler_->run_due(now_);
    schedule_scheduler_tick();
  });
}

void World::deliver_to_scheduler(std::uint64_t cid, const protocol::Message& message) {
  auto it = connections_.find(cid);
  if (it == connections_.end() || !it->second.scheduler_open) return;
  Connection& c = it->second;
  if (c.incarnation != incarnation_) return;
  if (const auto* hello = std::get_if<protocol::Hello>(&message)) {
    if (c.id != 0) return;
    c.id = scheduler_->next_client_id();
    by_id_[c.id] = cid;
    send(c.id, protocol::Welcome{protocol::kMaxVersion, c.id, 0});
    scheduler::ClientIdentity identity;
    identity.pid = static_cast<pid_t>(hello->pid);
    identity.uid = 1000;
    identity.start_time = hello->pid;
    const ClientSpec& spec = clients_[c.client]->spec;
    if (spec.pod >= 0) identity.pod_uid = pod_uid(spec.pod);
    if (Status s = scheduler_->register_client(c.id, identity, *hello, now_); !s) {
      fail("registration refused: " + s.error().message);
    }
  } else if (c.id == 0) {
    fail("a frame before hello");
  } else if (std::holds_alternative<protocol::Request>(message)) {
    scheduler_->request(c.id, now_);
  } else if (const auto* released = std::get_if<protocol::Released>(&message)) {
    scheduler_->release(c.id, *released, now_);
  } else if (const auto* usage = std::get_if<protocol::Usage>(&message)) {
    scheduler_->usage(c.id, *usage, now_);
  } else if (const auto* ping = std::get_if<protocol::Ping>(&message)) {
    send(c.id, protocol::Pong{ping->nonce});
  }
  schedule_scheduler_tick();
}

void World::scheduler_disconnect(std::uint64_t cid) {
  auto it = connections_.find(cid);
  if (it == connections_.end() || !it->second.scheduler_open) return;
  it->second.scheduler_open = false;
  if (it->second.incarnation == incarnation_ && it->second.id != 0) {
    scheduler_->disconnect(it->second.id, now_);
    by_id_.erase(it->second.id);
    schedule_scheduler_tick();
  }
}

void World::restart(Duration down) {
  trace("scheduler restarts, down " + std::to_string(to_ms(down)) + " ms");
  const scheduler::SchedulerState state = scheduler_->persistent_state();
  for (auto& [cid, c] : connections_) c.scheduler_open = false;
  start_scheduler(state);
  down_until_ = now_ + down;
  // Every client sees its socket close.
  for (auto& client : clients_) {
    if (client->alive && client->connection != 0) feed(*client, session::ConnectionLost{"reset"});
  }
}

void World::change_limits() {
  if (pod_limits_.empty()) return;
  const int p = rng_.range(0, static_cast<int>(pod_limits_.size()) - 1);
  Limits limits;
  limits.memory_bytes = static_cast<std::uint64_t>(rng_.range(1, 12)) * kGiB;
  static constexpr std::uint32_t kCores[] = {100, 80, 50, 30, 100};
  limits.core_percent = kCores[rng_.range(0, 4)];
  limits.priority = pod_limits_[p].priority;  // unchanged: only memory and core are set
  scheduler::Selector selector;
  selector.pod_uid = pod_uid(p);
  scheduler::LimitsChange change;
  change.memory = {scheduler::FieldChange::Op::kSet, limits.memory_bytes};
  change.core = {scheduler::FieldChange::Op::kSet, limits.core_percent};
  trace("pod " + std::to_string(p) + " limits " + std::to_string(limits.memory_bytes >> 30) +
        " GiB, core " + std::to_string(limits.core_percent));
  if (auto r = scheduler_->set_limits(selector, change, now_); !r) {
    fail("set-limits: " + r.error().message);
    return;
  }
  pod_limits_[p] = limits;
  pod_history_[p].push_back(limits);
  pod_changed_[p] = now_;
  ++result_.limit_changes;
  schedule_scheduler_tick();
}

// ---- the client side ----------------------------------------------------------------------------

SessionConfig World::session_config(const SimClient& c) const {
  SessionConfig config;
  config.gpu_uuid = gpu_uuid(c.spec.gpu);
  config.gpu_memory_bytes = sc_.gpu_bytes;
  config.pid = static_cast<std::uint32_t>(1000 + c.index);
  config.process_name = "sim-" + std::to_string(c.index);
  config.timing.idle_release = c.spec.idle_release;
  config.timing.reconnect_initial = 20ms;
  config.timing.reconnect_max = 500ms;
  if (c.spec.pod >= 0) {
    // The container's settings file, as the device plugin writes it: the pod's memory limit when
    // the container starts, or "pending" for a while when the plugin has not seen the pod yet.
    config.has_settings_file = true;
    config.limits_pending = c.spec.settings_pending > Duration{0};
    if (!config.limits_pending) config.declared.memory_bytes = pod_limits_[c.spec.pod].memory_bytes;
  }
  return config;
}

void World::start_client(SimClient& c) {
  c.alive = true;
  c.engine = std::make_unique<GrantSession>(session_config(c), c);
  trace("client " + std::to_string(c.index) + " starts");
  feed(c, session::Tick{});
  submit(c);
}

void World::exit_client(SimClient& c) {
  if (!c.alive) return;
  trace("client " + std::to_string(c.index) + " exits");
  c.alive = false;
  c.gone = true;
  c.waiting = false;
  c.release_due.reset();
  close_from_client(c);
  ++c.tick_generation;
}

void World::feed(SimClient& c, const session::Event& event) {
  if (!c.alive) return;
  if (std::holds_alternative<session::ConnectionLost>(event) ||
      std::holds_alternative<session::ConnectFailed>(event)) {
    c.unreachable = true;
  }
  const bool was_busy = c.engine->busy();
  std::vector<session::Action> actions = c.engine->handle(event, now_);
  ++result_.steps;
  if (was_busy && c.engine->busy()) ++result_.deferred;
  for (const session::Action& action : actions) perform(c, action);
  reschedule_tick(c);
}

void World::reschedule_tick(SimClient& c) {
  if (!c.alive) return;
  const std::optional<MonoTime> due = c.engine->next_deadline();
  if (due == c.tick_at) return;
  c.tick_at = due;
  if (!due) return;
  const std::uint64_t generation = ++c.tick_generation;
  SimClient* p = &c;
  at_time(*due, [this, p, generation] {
    if (generation != p->tick_generation) return;
    p->tick_at.reset();
    feed(*p, session::Tick{});
  });
}

void World::perform(SimClient& c, const session::Action& action) {
  SimClient* p = &c;
  const std::string who = "client " + std::to_string(c.index) + ": ";
  if (std::holds_alternative<session::Connect>(action)) {
    if (now_ < down_until_) {
      at_time(now_, [this, p] { feed(*p, session::ConnectFailed{"connection refused"}); });
      return;
    }
    const std::uint64_t cid = next_connection_++;
    Connection connection;
    connection.client = c.index;
    connection.incarnation = incarnation_;
    connections_[cid] = connection;
    c.connection = cid;
    at_time(now_, [this, p] { feed(*p, session::Connected{}); });
  } else if (std::holds_alternative<session::Disconnect>(action)) {
    close_from_client(c);
  } else if (const auto* send = std::get_if<session::Send>(&action)) {
    if (c.connection == 0) return fail(who + "sends with no connection");
    if (const auto* released = std::get_if<protocol::Released>(&send->message)) {
      if (c.release_due && released->epoch == c.revoked_epoch) c.release_due.reset();
      // A grant goes back only once the GPU work submitted under it has completed.
      if (c.work_end > now_ || c.in_launch) {
        fail(who + "released grant " + std::to_string(released->epoch) + " with GPU work queued");
      }
    }
    const std::uint64_t cid = c.connection;
    Connection& connection = connections_.at(cid);
    const MonoTime at = std::max(connection.last_to_scheduler, now_ + delay());
    connection.last_to_scheduler = at;
    at_time(at, [this, cid, message = send->message] { deliver_to_scheduler(cid, message); });
  } else if (const auto* pub = std::get_if<session::Publish>(&action)) {
    publish(c, *pub);
  } else if (std::holds_alternative<session::CloseGateToRelease>(action)) {
    c.gate_open = false;
    const std::uint64_t inside = c.in_launch ? 1 : 0;
    at_time(now_, [this, p, inside] { feed(*p, session::GateClosed{inside}); });
  } else if (std::holds_alternative<session::Drain>(action)) {
    if (c.spec.load == Load::kHung && c.revokes > c.spec.hang_after_revokes) {
      trace(who + "hangs in its drain");
      c.hung = true;
      return;  // never answers
    }
    at_time(std::max(now_, c.work_end), [this, p] { feed(*p, session::Drained{}); });
  } else if (const auto* out = std::get_if<session::SwapOut>(&action)) {
    const std::uint64_t bytes = c.to_move_out(out->bytes);
    if (c.on_host == 0) ++result_.swaps;
    at_time(now_ + transfer_time(bytes, c.spec.swap_bytes_per_s), [this, p, bytes] {
      p->on_host += bytes;
      feed(*p, session::SwappedOut{bytes});
    });
  } else if (const auto* in = std::get_if<session::SwapIn>(&action)) {
    const std::uint64_t bytes = c.to_move_in(in->limit);
    if (in->limit > 0) {
      ++result_.room_swap_ins;
      if (c.state != GrantState::kRequested)
        fail(who + "brings memory back into room while " + std::string(client::to_string(c.state)));
    }
    at_time(now_ + transfer_time(bytes, c.spec.swap_bytes_per_s), [this, p, bytes] {
      p->on_host -= std::min(p->on_host, bytes);
      feed(*p, session::SwappedIn{bytes});
    });
  } else if (const auto* apply = std::get_if<session::ApplyLimits>(&action)) {
    c.limits_unknown = false;
    check_limits_applied(c, apply->limits);
  } else if (std::holds_alternative<session::LimitsUnknown>(action)) {
    c.limits_unknown = true;
  } else if (std::holds_alternative<session::ReadSettings>(action)) {
    session::SettingsRead read;
    if (c.spec.pod >= 0 && now_ >= kStart + c.spec.start + c.spec.settings_pending) {
      read.memory_bytes = pod_limits_[c.spec.pod].memory_bytes;
    }
    at_time(now_, [this, p, read] { feed(*p, read); });
  } else if (std::holds_alternative<session::PrepareSwapOut>(action)) {
    // Advice for the grant held: nothing to ready otherwise.
    if (c.state != GrantState::kHeld) fail(who + "readies a swap-out without holding a grant");
    ++result_.swap_notices;
    c.noticed_epoch = c.held_epoch;
  } else if (const auto* record = std::get_if<session::Record>(&action)) {
    const std::string event = record->event;
    if (event == "yield") {
      ++result_.yields;
      c.yield_epoch = record->epoch;
    }
    if (event == "contended") {
      ++result_.contended;
      c.noticed_epoch = record->epoch;
    }
    if (event == "idle-release") record_idle_release(c, record->epoch);
    trace(who + event + " " + std::to_string(record->epoch));
  } else if (std::holds_alternative<session::Registered>(action)) {
    if (c.registered_at != MonoTime{}) ++result_.reconnects;
    c.unreachable = false;
    c.registered_at = now_;
  } else if (const auto* note = std::get_if<session::Note>(&action)) {
    trace(who + note->text);
  }
}

void World::publish(SimClient& c, const session::Publish& p) {
  const std::string who = "client " + std::to_string(c.index) + ": ";
  c.state = p.state;
  c.held_epoch = p.epoch;
  if (p.gate == session::GateChange::kOpen) c.gate_open = true;
  if (p.gate == session::GateChange::kClose) c.gate_open = false;
  trace(who + client::to_string(p.state) + (c.gate_open ? " (open)" : " (closed)"));
  if (p.state == GrantState::kHeld && p.gate == session::GateChange::kOpen && c.connection != 0) {
    ++result_.grants;
    if (c.swapped())
      fail(who + "runs grant " + std::to_string(p.epoch) + " with its memory on the host");
    const auto key =
        std::make_tuple(connections_.at(c.connection).incarnation, c.spec.gpu, p.epoch);
    const auto [it, added] = epoch_holder_.emplace(key, c.index);
    if (!added && it->second != c.index) {
      fail(who + "holds grant " + std::to_string(p.epoch) + " that client " +
           std::to_string(it->second) + " held");
    }
  }
  if (p.state == GrantState::kRevoking) {
    ++result_.revokes;
    ++c.revokes;
    // Threads inside a submission, the work queued (and one more launch's), then the swap.
    const Duration queued = std::max(Duration{0}, c.work_end - now_);
    c.release_due = now_ + c.spec.launch_call + queued + c.spec.kernel +
                    transfer_time(c.spec.bytes, c.spec.swap_bytes_per_s) + 1us;
    c.revoked_epoch = p.epoch;
    const MonoTime due = *c.release_due + 1ns;
    SimClient* client = &c;
    at_time(due, [this, client, due] {
      if (client->alive && !client->hung && client->release_due && *client->release_due < due) {
        fail("client " + std::to_string(client->index) + " did not release grant " +
             std::to_string(client->revoked_epoch) + " within its drain and swap bound");
      }
    });
  }
  if (p.state != GrantState::kRevoking) c.release_due.reset();
  if (c.gate_open && c.waiting) {
    // The waiting thread wakes a moment later; it counts as waiting until it passes the gate.
    SimClient* client = &c;
    at_time(now_ + kWakeLatency, [this, client] { submit(*client); });
  }
}

void World::deliver_to_client(std::uint64_t cid, const protocol::Message& message) {
  const Connection& connection = connections_.at(cid);
  SimClient& c = *clients_[connection.client];
  if (c.connection != cid || !connection.scheduler_open) return;
  feed(c, session::FrameReceived{message});
}

void World::drop(SimClient& c) {
  if (!c.alive || c.connection == 0) return;
  trace("client " + std::to_string(c.index) + ": connection dropped");
  scheduler_disconnect(c.connection);
  feed(c, session::ConnectionLost{"dropped"});
}

void World::close_from_client(SimClient& c) {
  if (c.connection == 0) return;
  const std::uint64_t cid = c.connection;
  at_time(now_ + delay(), [this, cid] { scheduler_disconnect(cid); });  // the scheduler sees EOF
  c.connection = 0;
}

void World::record_idle_release(const SimClient& c, std::uint64_t epoch) {
  ++result_.idle_releases;
  const auto i = static_cast<std::size_t>(c.index);
  const Duration after_work = now_ - std::max(c.work_end, c.last_submit);
  if (!done_working(c)) {
    ++result_.pause_releases[i];
    // A yield asks for the first idle moment: such a release is not the notice's.
    if (epoch == c.noticed_epoch && epoch != c.yield_epoch) {
      ++result_.noticed_pause_releases[i];
      result_.noticed_pause_release[i] = std::max(result_.noticed_pause_release[i], after_work);
    }
  } else if (epoch == c.noticed_epoch) {
    result_.noticed_end_release[i] = std::max(result_.noticed_end_release[i], after_work);
  }
}

bool World::done_working(const SimClient& c) const {
  return c.spec.idle_from > Duration{0} && now_ >= kStart + c.spec.idle_from;
}

void World::submit(SimClient& c) {
  if (!c.alive || c.in_launch) return;
  c.at_bound_now = false;
  if (!c.waiting && done_working(c)) return;
  if (!c.gate_open) {
    if (c.waiting) return;  // woken, but closed again: waits on
    c.waiting = true;
    c.wait_since = now_;
    feed(c, session::Tick{});  // the first waiter wakes the link thread
    return;
  }
  if (c.waiting) {
    c.waiting = false;
    result_.worst_wait = std::max(result_.worst_wait, now_ - c.wait_since);
  }
  c.in_launch = true;
  Duration call = c.spec.launch_call;
  if (c.spec.stall > Duration{0} && c.worked_since_stall >= c.spec.stall_every) {
    c.worked_since_stall = Duration{0};
    call = c.spec.stall;
  }
  SimClient* p = &c;
  at_time(now_ + call, [this, p] { launch_done(*p); });
}

void World::launch_done(SimClient& c) {
  if (!c.alive) return;
  c.in_launch = false;
  c.work_end = std::max(c.work_end, now_) + c.spec.kernel;
  c.last_submit = now_;
  c.worked_since_stall += c.spec.kernel;
  // The last thread out of a closed gate wakes the link thread.
  if (!c.gate_open) feed(c, session::Tick{});
  MonoTime next = now_ + 50us;
  c.worked += c.spec.kernel;
  if (c.spec.once_pause > Duration{0} && !c.paused_once && c.worked >= c.spec.once_pause_after) {
    c.paused_once = true;
    next = c.work_end + c.spec.once_pause;
  } else if (c.spec.load == Load::kBursty && --c.burst_left <= 0) {
    c.burst_left = rng_.range(5, 60);
    next = c.work_end + rng_.between(50ms, 1500ms);
  } else if (c.spec.pause > Duration{0} &&
             (c.worked_since_pause += c.spec.kernel) >= c.spec.pause_every) {
    c.worked_since_pause = Duration{0};
    next = c.work_end + c.spec.pause;
  } else if (c.spec.late_wake > Duration{0} && c.worked_since_stall >= c.spec.stall_every) {
    // A wait for the bound whose thread the driver wakes late: the GPU runs dry meanwhile.
    c.worked_since_stall = Duration{0};
    c.at_bound_now = true;
    next = c.work_end + c.spec.late_wake;
    SimClient* p = &c;
    at_time(next, [p] { p->at_bound_now = false; });
    next += c.spec.after_wake;
  } else if (c.work_end - now_ > kQueueAhead) {
    c.at_bound_now = true;
    next = c.work_end - kQueueAhead;
  }
  SimClient* p = &c;
  at_time(next, [this, p] { submit(*p); });
}

// ---- properties ---------------------------------------------------------------------------------

void World::check_limits_applied(const SimClient& c, const protocol::Limits& limits) {
  const std::string who = "client " + std::to_string(c.index) + ": ";
  if (c.spec.pod < 0) {
    if (limits != protocol::Limits{}) fail(who + "got limits but is in no pod");
    return;
  }
  // Memory is the limit the client enforces: never absent, never a value its pod did not have.
  // (A core cap is enforced by the scheduler; the client's copy is informational.)
  const std::vector<Limits>& had = pod_history_[c.spec.pod];
  const bool memory_ok = std::any_of(had.begin(), had.end(), [&](const Limits& l) {
    return l.memory_bytes == limits.memory_bytes;
  });
  if (!memory_ok) {
    fail(who + "applies memory " + std::to_string(limits.memory_bytes) +
         " bytes, which its pod never had");
  }
}

void World::check_limits_current() {
  for (const auto& client : clients_) {
    const SimClient& c = *client;
    if (!c.alive || c.spec.pod < 0) continue;
    const std::optional<protocol::Limits>& applied = c.engine->applied_limits();
    if (!applied) {
      // Unknown is allowed only as "refuse allocations until known" (LimitsUnknown), never as
      // "unlimited".
      if (!c.limits_unknown) fail("client " + std::to_string(c.index) + " has no limits");
      continue;
    }
    // Connected means welcomed on this connection, so registered_at is this connection's.
    if (!c.engine->connected() || c.engine->busy()) continue;
    const MonoTime settled = std::max(c.registered_at, pod_changed_[c.spec.pod]) + sc_.delay_max;
    if (now_ <= settled) continue;
    if (*applied != pod_limits_[c.spec.pod]) {
      fail("client " + std::to_string(c.index) + " applies memory " +
           std::to_string(applied->memory_bytes) + " core " +
           std::to_string(applied->core_percent) + " but its pod's limits are memory " +
           std::to_string(pod_limits_[c.spec.pod].memory_bytes) + " core " +
           std::to_string(pod_limits_[c.spec.pod].core_percent));
      return;
    }
  }
}

Duration World::stuck_bound() const {
  // Per GPU: every other client holding one quantum, its grace, its swap allowance and a swap in
  // each way (docs/scheduling.md), plus the scheduler's downtime, a reconnect, a quota window.
  std::vector<int> per_gpu(static_cast<std::size_t>(sc_.gpus), 0);
  Duration longest_swap{0};
  for (const ClientSpec& spec : sc_.clients) {
    ++per_gpu[static_cast<std::size_t>(spec.gpu)];
    longest_swap = std::max(longest_swap, transfer_time(spec.bytes, spec.swap_bytes_per_s));
  }
  const int n = *std::max_element(per_gpu.begin(), per_gpu.end());
  Duration down{0};
  for (const Restart& r : sc_.restarts) down += r.down + 2 * sc_.delay_max;
  const Duration per_turn = policy::hog_bound(sc_.config) + 2 * longest_swap + 4 * sc_.delay_max;
  return n * per_turn + down + 500ms + sc_.config.quota_window + 1s;
}

std::pair<int, std::uint64_t> World::unresponsive_holders(int gpu) const {
  int count = 0;
  std::uint64_t bytes = 0;
  const scheduler::StatusSnapshot snapshot = scheduler_->snapshot(now_);
  for (const scheduler::GpuStatus& status : snapshot.gpus) {
    if (status.uuid != gpu_uuid(gpu)) continue;
    for (const policy::ClientView& v : status.view.clients) {
      if (v.state != policy::ClientState::kUnresponsive) continue;
      ++count;
      bytes += v.allocated_bytes;
    }
  }
  return {count, bytes};
}

void World::check_step() {
  if (!result_.ok) return;
  for (int g = 0; g < sc_.gpus; ++g) {
    int holders = 0;
    std::uint64_t bytes = 0;
    for (const auto& client : clients_) {
      const SimClient& c = *client;
      if (!c.alive || c.hung || c.spec.gpu != g) continue;
      if (c.state != GrantState::kHeld && c.state != GrantState::kRevoking) continue;
      // A grant of a connection the scheduler has lost (a restart, a drop) is no longer one: the
      // client finds out when its agent work ends, and runs unscheduled meanwhile.
      if (c.connection == 0) continue;
      const Connection& connection = connections_.at(c.connection);
      if (!connection.scheduler_open || connection.incarnation != incarnation_) continue;
      ++holders;
      bytes += c.spec.bytes;
    }
    const double usable = static_cast<double>(sc_.gpu_bytes) * (1 - sc_.config.reserve_fraction);
    const bool exclusive = sc_.config.mode == policy::Mode::kExclusive;
    if (holders > 1 && (exclusive || static_cast<double>(bytes) > usable)) {
      // A holder the scheduler declared unresponsive (past its grace and swap allowance: a swap
      // slower than the allowance, a swap-in after an eviction) no longer blocks, by design.
      const auto [count, unresponsive] = unresponsive_holders(g);
      bytes -= std::min(bytes, unresponsive);
      holders -= count;
    }
    if (exclusive && holders > 1) {
      fail(std::to_string(holders) + " clients hold GPU " + std::to_string(g) +
           " in exclusive mode");
    }
    if (holders > 1 && static_cast<double>(bytes) > usable) {
      fail(std::to_string(holders) + " holders of GPU " + std::to_string(g) + " need " +
           std::to_string(bytes >> 20) + " MiB, more than fits");
    }
  }
  const Duration bound = stuck_bound();
  for (const auto& client : clients_) {
    const SimClient& c = *client;
    // Fail-open: once the engine has taken in that the scheduler is gone, nothing waits for it.
    if (c.alive && c.unreachable && !c.engine->busy() && !c.gate_open) {
      fail("client " + std::to_string(c.index) +
           ": gate closed while the scheduler is unreachable");
    }
    if (c.alive && !c.hung && c.waiting && now_ - c.wait_since > bound) {
      fail("client " + std::to_string(c.index) + " has waited " +
           std::to_string(to_ms(now_ - c.wait_since)) + " ms at the gate (bound " +
           std::to_string(to_ms(bound)) + " ms)");
    }
  }
}

Result World::run() {
  pod_limits_ = sc_.pods;
  for (const Limits& l : sc_.pods) pod_history_.push_back({l});
  pod_changed_.assign(sc_.pods.size(), kStart);
  result_.stuck_bound = stuck_bound();
  result_.pause_releases.assign(sc_.clients.size(), 0);
  result_.noticed_end_release.assign(sc_.clients.size(), Duration{-1});
  result_.noticed_pause_releases.assign(sc_.clients.size(), 0);
  result_.noticed_pause_release.assign(sc_.clients.size(), Duration{-1});
  start_scheduler(std::nullopt);
  for (std::size_t i = 0; i < sc_.clients.size(); ++i) {
    clients_.push_back(std::make_unique<SimClient>(*this, static_cast<int>(i), sc_.clients[i]));
    SimClient* c = clients_.back().get();
    at_time(kStart + c->spec.start, [this, c] { start_client(*c); });
    if (c->spec.exit_at > Duration{0}) {
      at_time(kStart + c->spec.exit_at, [this, c] { exit_client(*c); });
    }
  }
  for (const Restart& r : sc_.restarts) at_time(kStart + r.at, [this, r] { restart(r.down); });
  for (const Drop& d : sc_.drops) {
    at_time(kStart + d.at, [this, d] { drop(*clients_[static_cast<std::size_t>(d.client)]); });
  }
  const MonoTime end = kStart + sc_.length;
  if (sc_.limit_change_every > Duration{0}) {
    for (MonoTime t = kStart + rng_.between(Duration{0}, sc_.limit_change_every * 2); t < end;
         t += rng_.between(sc_.limit_change_every / 2, sc_.limit_change_every * 3 / 2)) {
      at_time(t, [this] { change_limits(); });
    }
  }
  for (MonoTime t = kStart; t < end; t += kCheckEvery) {
    at_time(t, [this] { check_limits_current(); });
  }
  // Virtual time must move: steps without end at one instant are a busy loop (an engine whose
  // next deadline is now, again and again), which on a real host burns a core.
  std::uint64_t steps_at_instant = 0;
  while (!queue_.empty() && result_.ok) {
    Step step = queue_.top();
    if (step.at > end) break;
    queue_.pop();
    steps_at_instant = step.at == now_ ? steps_at_instant + 1 : 0;
    now_ = step.at;
    step.fn();
    check_step();
    if (steps_at_instant > kMaxStepsAtOneInstant) {
      fail(std::to_string(steps_at_instant) + " steps without virtual time moving: a busy loop");
    }
  }
  if (result_.ok) {
    now_ = end;
    check_step();
  }
  if (result_.ok && sc_.cap_tolerance_points > 0) {
    const scheduler::StatusSnapshot snapshot = scheduler_->snapshot(now_);
    const SimClient& first = *clients_.front();
    const std::uint64_t cid = first.connection;
    std::optional<double> share;
    for (const scheduler::GpuStatus& gpu : snapshot.gpus) {
      for (const scheduler::ClientStatus& status : gpu.clients) {
        if (cid != 0 && status.id == connections_.at(cid).id && status.connected_for.count() > 0) {
          share = 100.0 * static_cast<double>(status.view.held_total.count()) /
                  static_cast<double>(status.connected_for.count());
        }
      }
    }
    const double cap = sc_.clients.empty() || sc_.clients.front().pod < 0
                           ? 100.0
                           : pod_limits_[sc_.clients.front().pod].core_percent;
    if (!share) {
      fail("the capped client is not connected at the end");
    } else {
      result_.first_share_percent = *share;
      if (std::abs(*share - cap) > sc_.cap_tolerance_points) {
        fail("the capped client's share is " + std::to_string(*share) + "%, its cap " +
             std::to_string(cap) + "%");
      }
    }
  }
  if (tracing_) result_.trace.assign(trace_.begin(), trace_.end());
  return result_;
}

}  // namespace

// ---- scenarios ----------------------------------------------------------------------------------

Scenario random_scenario(std::uint64_t seed) {
  sim::Rng rng(seed);
  Scenario s;
  s.name = "random";
  s.seed = seed;
  s.config.mode = rng.chance(0.4) ? policy::Mode::kExclusive : policy::Mode::kAuto;
  if (rng.chance(0.5)) {
    s.config.fixed_quantum = rng.between(30ms, 400ms);
  } else {
    s.config.quantum_min = 30ms;
    s.config.quantum_max = rng.between(100ms, 800ms);
  }
  s.config.revoke_grace = rng.between(50ms, 400ms);
  s.config.swap_allowance_max = 10s;  // the default: above any honest swap here
  s.config.quota_window = rng.between(200ms, 1000ms);
  s.gpus = rng.chance(0.3) ? 2 : 1;
  const int pods = rng.range(1, 3);
  static constexpr std::uint32_t kCores[] = {100, 100, 50, 30};
  for (int p = 0; p < pods; ++p) {
    Limits l;
    l.memory_bytes = static_cast<std::uint64_t>(rng.range(2, 12)) * kGiB;
    l.core_percent = kCores[rng.range(0, 3)];
    s.pods.push_back(l);
  }
  s.length = 12s;
  const int clients = rng.range(2, 6);
  for (int i = 0; i < clients; ++i) {
    ClientSpec c;
    const double kind = rng.uniform();
    c.load = kind < 0.5 ? Load::kBusy : kind < 0.9 ? Load::kBursty : Load::kHung;
    c.gpu = rng.range(0, s.gpus - 1);
    c.pod = rng.chance(0.7) ? rng.range(0, pods - 1) : -1;
    c.bytes = static_cast<std::uint64_t>(rng.range(1, 10)) * kGiB;
    c.start = rng.between(Duration{0}, 2s);
    if (rng.chance(0.15)) c.exit_at = rng.between(3s, s.length);
    c.kernel = rng.between(300us, 6ms);
    c.launch_call = rng.between(5us, 200us);
    c.swap_bytes_per_s = rng.uniform(3e9, 25e9);
    c.hang_after_revokes = rng.range(0, 3);
    c.idle_release = rng.chance(0.2) ? Duration{0} : rng.between(5ms, 150ms);
    if (c.pod >= 0 && rng.chance(0.3)) c.settings_pending = rng.between(1ms, 300ms);
    s.clients.push_back(c);
  }
  for (int r = rng.range(0, 2); r > 0; --r) {
    s.restarts.push_back(Restart{rng.between(1s, s.length - 2s), rng.between(Duration{0}, 400ms)});
  }
  for (int d = rng.range(0, 3); d > 0; --d) {
    s.drops.push_back(Drop{rng.between(500ms, s.length), rng.range(0, clients - 1)});
  }
  if (rng.chance(0.6)) s.limit_change_every = rng.between(200ms, 2s);
  s.delay_max = rng.between(Duration{0}, 3ms);
  return s;
}

std::vector<Scenario> named_scenarios() {
  std::vector<Scenario> out;
  const auto base = [](std::string name, policy::Mode mode) {
    Scenario s;
    s.name = std::move(name);
    s.seed = 7;
    s.config.mode = mode;
    s.config.quantum_min = 30ms;
    s.config.quantum_max = 300ms;
    s.config.revoke_grace = 200ms;
    s.config.swap_allowance_max = 3s;
    s.config.quota_window = 500ms;
    return s;
  };
  {
    // Quota revokes land while the grant's swap-in is still running.
    Scenario s = base("revoke during swap-in", policy::Mode::kExclusive);
    s.config.fixed_quantum = 40ms;
    s.pods = {Limits{12 * kGiB, 30}};
    s.clients = {ClientSpec{Load::kBusy, 0, 0, 10 * kGiB},
                 ClientSpec{Load::kBusy, 0, -1, 10 * kGiB}};
    s.clients[0].swap_bytes_per_s = 4e9;
    s.clients[1].swap_bytes_per_s = 4e9;
    s.delay_max = 2ms;
    out.push_back(s);
  }
  {
    Scenario s = base("restarts every second under turn-taking", policy::Mode::kAuto);
    s.pods = {Limits{8 * kGiB, 100}, Limits{6 * kGiB, 50}};
    for (int i = 0; i < 4; ++i) s.clients.push_back(ClientSpec{Load::kBusy, 0, i % 2, 9 * kGiB});
    for (int r = 1; r < 20; ++r) s.restarts.push_back(Restart{r * 1s, (r % 3) * 100ms});
    s.limit_change_every = 300ms;
    out.push_back(s);
  }
  {
    Scenario s = base("bursty clients release when idle and yield", policy::Mode::kExclusive);
    s.pods = {Limits{4 * kGiB, 100}};
    for (int i = 0; i < 5; ++i) {
      ClientSpec c{Load::kBursty, 0, i % 2 == 0 ? 0 : -1, 2 * kGiB};
      c.idle_release = i == 0 ? Duration{0} : 20ms;
      s.clients.push_back(c);
    }
    out.push_back(s);
  }
  {
    Scenario s = base("a drain that never ends", policy::Mode::kExclusive);
    s.clients = {ClientSpec{Load::kHung, 0, -1, 4 * kGiB}, ClientSpec{Load::kBusy, 0, -1, 4 * kGiB},
                 ClientSpec{Load::kBusy, 0, -1, 4 * kGiB}};
    s.clients[0].hang_after_revokes = 1;
    out.push_back(s);
  }
  {
    Scenario s = base("dropped connections and limit changes", policy::Mode::kAuto);
    s.pods = {Limits{3 * kGiB, 100}, Limits{5 * kGiB, 30}};
    for (int i = 0; i < 4; ++i)
      s.clients.push_back(ClientSpec{Load::kBusy, i % 2, i % 2, 3 * kGiB});
    s.gpus = 2;
    for (int d = 0; d < 30; ++d) s.drops.push_back(Drop{d * 600ms + 100ms, d % 4});
    s.limit_change_every = 150ms;
    out.push_back(s);
  }
  {
    // Three jobs that do not fit beside each other take turns; two pause now and then, and each
    // stops working while holding (its memory stays): a turn's end is handed over soon after the
    // work ends, where a job waits for the memory, but a pause is handed over at most once.
    Scenario s = base(kNoticedEndsScenario, policy::Mode::kAuto);
    s.config.quantum_max = 3s;  // turns long beside the swaps (0.2 s each way)
    for (int i = 0; i < 3; ++i) {
      s.clients.push_back(ClientSpec{Load::kBusy, 0, -1, 8 * kGiB});
      s.clients.back().swap_bytes_per_s = 40e9;
    }
    s.clients[0].pause = 40ms;
    s.clients[0].pause_every = 150ms;
    s.clients[1].pause = 25ms;
    s.clients[1].pause_every = 250ms;
    // Client 2 stops during its first turn, while both others wait; 0 and 1 take turns after.
    s.clients[0].idle_from = 14s;
    s.clients[1].idle_from = 20s;
    s.clients[2].idle_from = 2s;
    s.length = 24s;
    out.push_back(s);
  }
  {
    // Two jobs that do not fit beside each other take turns, each told that the other waits for
    // its memory (a swap notice); neither ever pauses, but now and then the driver wakes a thread
    // that waits for the drain bound 90 ms after the work it waited for is done, the GPU idle
    // meanwhile, and the thread spends 2 ms on the host before its next launch: the process was
    // submitting, not idle, so no turn ends there, nor in the 2 ms after.
    Scenario s = base(kLateWakesScenario, policy::Mode::kAuto);
    s.config.quantum_max = 3s;
    for (int i = 0; i < 2; ++i) {
      s.clients.push_back(ClientSpec{Load::kBusy, 0, -1, 12 * kGiB});
      s.clients.back().swap_bytes_per_s = 40e9;
      s.clients.back().late_wake = 90ms;
      s.clients.back().after_wake = 2ms;
      s.clients.back().stall_every = 500ms;
    }
    s.length = 16s;
    out.push_back(s);
  }
  {
    // A high service of 2 ms kernels that pauses 1 s after every 1 s of work, beside a low trainer
    // of 20 ms kernels that never idles: the trainer's drains delay the service's return, so the
    // budget holds it back while the service runs, and the service, told so (contended), hands
    // each pause over at its start, not after its idle release.
    Scenario s = base(kContendedPausesScenario, policy::Mode::kAuto);
    const auto pod = [](nvshare::Priority p) {
      return Limits{4 * kGiB, 100, Limits::kNoMemoryMode, protocol::priority_code(p)};
    };
    s.pods = {pod(nvshare::Priority::kHigh), pod(nvshare::Priority::kLow)};
    s.clients = {ClientSpec{Load::kBusy, 0, 0, 2 * kGiB}, ClientSpec{Load::kBusy, 0, 1, 2 * kGiB}};
    s.clients[0].kernel = 2ms;
    s.clients[0].pause = 1s;
    s.clients[0].pause_every = 1s;
    s.clients[1].kernel = 20ms;
    s.length = 20s;
    out.push_back(s);
    // The same service with gaps of 30 ms after every 100 ms of work instead: a gap is no pause
    // to hand over, and once one was handed over (it is learnt), none is again.
    // The first service again, with a launch call the driver holds for 90 ms after every 500 ms
    // of its work (the GPU runs dry meanwhile): such a stall is no pause of the service, so it is
    // not learnt, and the service's pauses still go down at once.
    s.name = kStalledLaunchesScenario;
    s.clients[0].stall = 90ms;
    s.clients[0].stall_every = 500ms;
    out.push_back(s);
    s.clients[0].stall = Duration{0};
    // The first service again, with one pause of 60 ms after its first 100 ms of work (a start-up
    // before its loop): made once, it is not waited out, and the later pauses go down at once.
    s.name = kOneOffPauseScenario;
    s.clients[0].once_pause = 60ms;
    s.clients[0].once_pause_after = 100ms;
    out.push_back(s);
    s.clients[0].once_pause = Duration{0};
    s.name = kContendedGapsScenario;
    s.clients[0].pause = 30ms;
    s.clients[0].pause_every = 100ms;
    out.push_back(s);
  }
  for (const policy::Mode mode : {policy::Mode::kExclusive, policy::Mode::kAuto}) {
    // A 30% cap beside an uncapped compute-bound job (they fit together in auto).
    Scenario s =
        base(std::string("30% cap beside an uncapped job, ") + std::string(policy::to_string(mode)),
             mode);
    s.pods = {Limits{4 * kGiB, 30}};
    s.clients = {ClientSpec{Load::kBusy, 0, 0, 4 * kGiB}, ClientSpec{Load::kBusy, 0, -1, 4 * kGiB}};
    s.length = 30s;
    s.cap_tolerance_points = 3;
    out.push_back(s);
  }
  return out;
}

std::string describe(const Scenario& s) {
  std::ostringstream out;
  out << s.name << " seed " << s.seed << ": " << policy::to_string(s.config.mode) << ", " << s.gpus
      << " GPU(s), delay <= " << to_ms(s.delay_max) << " ms, " << s.restarts.size() << " restarts, "
      << s.drops.size() << " drops; clients:";
  for (const ClientSpec& c : s.clients) {
    out << " ["
        << (c.load == Load::kBusy     ? "busy"
            : c.load == Load::kBursty ? "bursty"
                                      : "hung")
        << " gpu " << c.gpu << " pod " << c.pod << " " << (c.bytes >> 30) << "GiB]";
  }
  return out.str();
}

Result run(const Scenario& scenario, bool trace) { return World(scenario, trace).run(); }

}  // namespace nvshare::linksim
