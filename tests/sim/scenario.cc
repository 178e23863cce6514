#include "scenario.h"

#include <algorithm>
#include <cmath>

#include "rng.h"

namespace nvshare::sim {

using namespace std::chrono_literals;
using policy::Mode;

const char* to_string(Behaviour behaviour) {
  switch (behaviour) {
    case Behaviour::kComputeBound:
      return "compute";
    case Behaviour::kBursty:
      return "bursty";
    case Behaviour::kIdle:
      return "idle";
    case Behaviour::kHung:
      return "hung";
    case Behaviour::kCrashing:
      return "crashing";
  }
  return "?";
}

namespace {

ClientSpec random_client(Rng& rng, std::uint64_t capacity, Duration length) {
  ClientSpec c;
  const double kind = rng.uniform();
  c.behaviour = kind < 0.35   ? Behaviour::kComputeBound
                : kind < 0.6  ? Behaviour::kBursty
                : kind < 0.72 ? Behaviour::kIdle
                : kind < 0.84 ? Behaviour::kHung
                              : Behaviour::kCrashing;
  // Small clients share the GPU; large ones (up to 110% of it) must take turns or run alone.
  const double fraction = rng.chance(0.6) ? rng.uniform(0.02, 0.3) : rng.uniform(0.35, 1.1);
  c.working_set = static_cast<std::uint64_t>(fraction * static_cast<double>(capacity));
  if (rng.chance(0.4)) c.limits.core_percent = static_cast<std::uint8_t>(rng.range(5, 95));
  if (rng.chance(0.3)) c.limits.memory_bytes = c.working_set + kGiB;
  if (c.behaviour == Behaviour::kComputeBound && rng.chance(0.4)) c.step = rng.between(1ms, 300ms);
  c.start = rng.between(0s, 5s);
  c.swap_bytes_per_s = rng.uniform(4e9, 20e9);
  c.grows = rng.chance(0.3);
  c.hang_after_revokes = rng.range(0, 2);
  c.wake_after = rng.chance(0.5) ? rng.between(2s, 15s) : 0s;
  c.crash_at = c.start + rng.between(100ms, length);
  c.reconnects = rng.chance(0.6);
  // Some hung clients also lie: huge memory, a crawling swap, or both.
  if (c.behaviour == Behaviour::kHung && rng.chance(0.5)) {
    if (rng.chance(0.6)) c.reported_bytes = std::uint64_t{1} << 60;
    if (rng.chance(0.6)) c.reported_swap_bytes_per_s = 1;
  }
  // Half take byte targets, moving whole allocations of 1 to 8 per working set.
  if (rng.chance(0.5)) c.chunk = std::max<std::uint64_t>(1, c.working_set / rng.range(1, 8));
  return c;
}

}  // namespace

Scenario random_scenario(std::uint64_t seed) {
  Rng rng(seed);
  Scenario s;
  s.name = "random";
  s.seed = seed;
  PolicyConfig& config = s.config;
  config.mode = rng.chance(0.25) ? Mode::kExclusive : Mode::kAuto;
  if (rng.chance(0.7)) config.capacity_bytes = 16 * kGiB;
  config.device_bytes = rng.chance(0.9) ? 24 * kGiB : 0;  // 0: the device's memory is unknown
  const double reserves[] = {0.0, 0.1, 0.2};
  config.reserve_fraction = reserves[rng.range(0, 2)];
  if (rng.chance(0.4)) {
    config.fixed_quantum = rng.between(200ms, 3s);
  } else {
    config.quantum_swap_multiple = rng.chance(0.5) ? 5.0 : 2.0;
    config.quantum_min = rng.between(200ms, 1s);
    config.quantum_max = config.quantum_min + rng.between(0s, 5s);
  }
  config.default_swap_bytes_per_s = rng.chance(0.5) ? 2'000'000'000 : 8'000'000'000;
  const Duration windows[] = {500ms, 1s, 2s};
  config.quota_window = windows[rng.range(0, 2)];
  config.revoke_grace = rng.between(500ms, 3s);
  config.swap_allowance_max = rng.between(0s, 5s);

  s.length = rng.between(20s, 60s);
  const std::uint64_t capacity = config.capacity_bytes.value_or(24 * kGiB);
  const int clients = rng.range(2, 7);
  for (int i = 0; i < clients; ++i) s.clients.push_back(random_client(rng, capacity, s.length));
  // Paces from their own stream, so that the rest of a seed's scenario stays what it was.
  Rng paces(seed ^ 0x9ace5eedULL);
  const std::uint16_t levels[] = {0, 200, 400, 600, 1000};
  for (ClientSpec& c : s.clients) {
    if (paces.chance(0.4)) continue;  // reports no pace, as an older client
    c.pace = levels[paces.range(0, 4)];
    if (paces.chance(0.4)) {
      c.pace_change_at = paces.between(1s, 20s);
      c.later_pace = levels[paces.range(0, 4)];
    }
  }
  // Priority classes from their own stream too: a third of the scenarios mix classes.
  Rng classes(seed ^ 0xc1a55e5ULL);
  if (classes.chance(1.0 / 3)) {
    for (ClientSpec& c : s.clients) {
      c.limits.priority = static_cast<std::uint8_t>(classes.range(0, 3));  // 0: none (normal)
    }
  }
  if (rng.chance(0.5)) s.limit_change_every = rng.between(1s, 8s);
  s.stale_releases = rng.chance(0.5);
  return s;
}

std::vector<Scenario> saturating_cases() {
  std::vector<Scenario> all;
  auto base = [](std::string name) {
    Scenario s;
    s.name = std::move(name);
    s.seed = 1;
    s.config.mode = Mode::kAuto;
    s.config.capacity_bytes = 16 * kGiB;
    s.length = 60s;
    return s;
  };
  auto client = [](std::optional<std::uint16_t> pace, Duration step = 0s) {
    ClientSpec c;
    c.behaviour = Behaviour::kComputeBound;
    c.working_set = 2 * kGiB;
    c.pace = pace;
    c.step = step;
    return c;
  };
  for (int saturating = 2; saturating <= 4; ++saturating) {
    for (int interactive = 0; interactive <= 2; ++interactive) {
      Scenario s = base(std::to_string(saturating) + " saturating + " +
                        std::to_string(interactive) + " interactive");
      for (int i = 0; i < saturating; ++i) s.clients.push_back(client(1000));
      for (int i = 0; i < interactive; ++i) s.clients.push_back(client(0, 2ms));
      all.push_back(s);
    }
  }
  return all;
}

namespace {

// `jobs` compute-bound jobs of `working_set` each, started `apart`, swapping at `bandwidth`.
Scenario swapping_jobs(Mode mode, int jobs, std::uint64_t working_set, Duration apart,
                       double bandwidth) {
  Scenario s;
  s.config.mode = mode;
  for (int i = 0; i < jobs; ++i) {
    ClientSpec c;
    c.behaviour = Behaviour::kComputeBound;
    c.working_set = working_set;
    c.start = apart * i;
    c.swap_bytes_per_s = bandwidth;
    s.clients.push_back(c);
  }
  return s;
}

}  // namespace

std::vector<Scenario> swap_turn_cases() {
  std::vector<Scenario> all;
  for (const Mode mode : {Mode::kAuto, Mode::kExclusive}) {
    for (int jobs = 2; jobs <= 3; ++jobs) {
      for (const Duration apart : {Duration{100ms}, Duration{3s}}) {
        Scenario s = swapping_jobs(mode, jobs, 10 * kGiB, apart, 50e9);
        s.name =
            std::to_string(jobs) + " jobs of 10 GiB, " +
            std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(apart).count()) +
            " ms apart";
        s.seed = 7;
        s.config.capacity_bytes = 16 * kGiB;
        s.length = 120s;
        for (ClientSpec& c : s.clients) c.host_copy_bytes_per_s = 4.6e9;
        all.push_back(s);
      }
    }
  }
  return all;
}

std::vector<Scenario> swap_share_cases() {
  std::vector<Scenario> all;
  for (const Mode mode : {Mode::kAuto, Mode::kExclusive}) {
    for (int jobs = 2; jobs <= 3; ++jobs) {
      for (const double bandwidth : {50e9, 100e9}) {
        Scenario s = swapping_jobs(mode, jobs, 4 * kGiB, 100ms, bandwidth);
        s.name = std::to_string(jobs) + " jobs of 4 GiB at " +
                 std::to_string(static_cast<int>(bandwidth / 1e9)) + " GB/s";
        s.seed = 11;
        s.config.capacity_bytes = 6 * kGiB;
        s.length = 180s;
        all.push_back(s);
      }
    }
  }
  return all;
}

std::vector<PriorityCase> priority_cases() {
  std::vector<PriorityCase> all;
  auto base = [](std::string name, Mode mode) {
    Scenario s;
    s.name = std::move(name);
    s.seed = 1;
    s.config.mode = mode;
    s.config.capacity_bytes = 16 * kGiB;
    s.length = 30s;
    return s;
  };
  auto client = [](Priority priority, std::uint64_t working_set, Duration step) {
    ClientSpec c;
    c.behaviour = Behaviour::kComputeBound;
    c.working_set = working_set;
    c.step = step;
    c.limits.priority = protocol::priority_code(priority);
    // A low client's queued work is held to a short drain bound (what its library does).
    if (priority == Priority::kLow) c.max_drain = 2ms;
    return c;
  };
  for (Mode mode : {Mode::kAuto, Mode::kExclusive}) {
    const std::string m = mode == Mode::kAuto ? " (auto)" : " (exclusive)";
    // What a lower class's drains may overlap the high client's steps over the run: the budget's
    // rate and burst, and one drain of at most `drain` per floor (the floor's grants).
    auto shared_bound = [](const Scenario& s, Duration drain) {
      const PolicyConfig& p = s.config;
      const double floors = std::ceil(to_seconds(s.length) / to_seconds(p.priority_floor)) + 1;
      return p.priority_interference * (to_seconds(s.length) + to_seconds(p.priority_floor)) +
             floors * to_seconds(drain) + 0.001;
    };
    {  // A service in 5 ms steps with short gaps beside a trainer that never idles and drains in
       // up to 2 ms: the service gets the GPU at once (the trainer drains beside it); the drains
       // take more than a tenth of its steps, so the trainer runs in the gaps only within the
       // interference budget, and at least once per floor; the steps its drains slow are bounded
       // by the budget too.
      PriorityCase c;
      c.scenario = base("high service beside low trainer" + m, mode);
      c.scenario.clients = {client(Priority::kHigh, 2 * kGiB, 5ms),
                            client(Priority::kLow, 2 * kGiB, 0s)};
      c.high_wait_bound = 0s;
      c.low_per_window = 0.0005;
      c.high_shared_max = shared_bound(c.scenario, 2ms);
      // And the steps they slow: each charged drain costs a cycle of the service at least, and
      // the service hands over within a step of being asked to yield (half a step on average, as
      // the scheduler sees its steps), so at most the budget over half a step, plus the floor's
      // grants and the first drain. Charged only for their time, the drains slowed 121 steps.
      const PolicyConfig& p = c.scenario.config;
      c.high_slowed_max =
          p.priority_interference * (to_seconds(c.scenario.length) + to_seconds(p.priority_floor)) /
              (to_seconds(5ms) / 2) +
          std::ceil(to_seconds(c.scenario.length) / to_seconds(p.priority_floor)) + 2;
      all.push_back(c);
    }
    {  // The same service beside a trainer of long kernels (each drain up to 20 ms): held to the
       // budget, it delays the service's steps for at most about 0.5% of the time.
      PriorityCase c;
      c.scenario = base("high service beside low trainer of long kernels" + m, mode);
      ClientSpec low = client(Priority::kLow, 2 * kGiB, 0s);
      low.max_drain = 20ms;
      c.scenario.clients = {client(Priority::kHigh, 2 * kGiB, 5ms), low};
      c.high_wait_bound = 0s;
      c.low_per_window = 0.0005;
      c.high_shared_max = shared_bound(c.scenario, 20ms);
      all.push_back(c);
    }
    {  // A trainer whose drains are short (up to 500 us, within a tenth of the service's steps)
       // costs the service nothing worth charging: it takes the service's gaps freely. One whose
       // kernels become short after 15 s (drains of 20 ms, then 100 us) takes them from then on.
      for (bool changes : {false, true}) {
        PriorityCase c;
        c.scenario = base(std::string("high service beside low trainer of short kernels") +
                              (changes ? ", after long ones" : "") + m,
                          mode);
        ClientSpec low = client(Priority::kLow, 2 * kGiB, 0s);
        low.max_drain = changes ? 20ms : 500us;
        if (changes) {
          low.pace_change_at = 15s;
          low.later_max_drain = 500us;
        }
        c.scenario.clients = {client(Priority::kHigh, 2 * kGiB, 20ms), low};
        c.high_wait_bound = 0s;
        c.low_per_window = 0.2;
        c.low_runs_from = changes ? 20s : 0s;
        all.push_back(c);
      }
    }
    {  // Two trainers that do not fit together: the high one is never swapped out for the low one,
       // which waits while the high one has work and runs once it is gone.
      PriorityCase c;
      c.scenario = base("high trainer, low trainer, not fitting" + m, mode);
      ClientSpec high = client(Priority::kHigh, 10 * kGiB, 0s);
      high.behaviour = Behaviour::kCrashing;
      high.crash_at = 10s;
      high.start = 100ms;  // the low one runs first and is preempted
      c.scenario.clients = {high, client(Priority::kLow, 10 * kGiB, 0s)};
      c.high_wait_bound = 2ms + 1us + std::chrono::milliseconds(1'500);  // drain + swap-out
      c.low_waits_until = 10s;
      c.low_before = 0.2;
      c.low_per_window = 4.5;
      c.low_runs_from = 11s;
      all.push_back(c);
    }
    {  // Normal between high and low: the high service preempts both, normal preempts low.
      PriorityCase c;
      c.scenario = base("high service, normal and low trainers" + m, mode);
      c.scenario.clients = {client(Priority::kHigh, 2 * kGiB, 5ms),
                            client(Priority::kNormal, 2 * kGiB, 20ms),
                            client(Priority::kLow, 2 * kGiB, 0s)};
      c.high_wait_bound = 0s;  // the normal and low trainers drain beside it
      all.push_back(c);
    }
  }
  return all;
}

std::vector<Scenario> named_scenarios() {
  std::vector<Scenario> all;
  auto base = [](const char* name) {
    Scenario s;
    s.name = name;
    s.seed = 1;
    s.config.mode = Mode::kAuto;  // most situations are about co-running; one sets exclusive
    s.config.capacity_bytes = 16 * kGiB;
    s.config.fixed_quantum = 1s;
    s.config.revoke_grace = 2s;
    s.length = 60s;
    return s;
  };
  auto client = [](Behaviour b, std::uint64_t working_set, int core = 100) {
    ClientSpec c;
    c.behaviour = b;
    c.working_set = working_set;
    c.limits.core_percent = static_cast<std::uint8_t>(core);
    return c;
  };

  {  // A holder stops answering revokes; two others must still get the GPU.
    Scenario s = base("hung holder");
    ClientSpec hung = client(Behaviour::kHung, 10 * kGiB);
    hung.hang_after_revokes = 1;
    s.clients = {hung, client(Behaviour::kComputeBound, 10 * kGiB),
                 client(Behaviour::kComputeBound, 6 * kGiB)};
    all.push_back(s);
  }
  {  // A hung holder that lies: 2^60 bytes at 1 byte/s. Its quantum and swap allowance stay
     // bounded (auto quantum, so the lie would stretch an unbounded one).
    Scenario s = base("lying hung holder");
    s.config.fixed_quantum.reset();
    s.config.quantum_min = 500ms;
    s.config.quantum_max = 3s;
    s.config.swap_allowance_max = 4s;
    ClientSpec hung = client(Behaviour::kHung, 10 * kGiB);
    hung.hang_after_revokes = 0;
    hung.wake_after = 6s;  // and it comes back to do it again: the strike shortens its turns
    hung.reported_bytes = std::uint64_t{1} << 60;
    hung.reported_swap_bytes_per_s = 1;
    s.clients = {hung, client(Behaviour::kComputeBound, 10 * kGiB),
                 client(Behaviour::kBursty, 6 * kGiB)};
    all.push_back(s);
  }
  {  // The same holder wakes up later and becomes a normal client again.
    Scenario s = base("hung holder wakes up");
    ClientSpec hung = client(Behaviour::kHung, 10 * kGiB, 40);
    hung.wake_after = 8s;
    s.clients = {hung, client(Behaviour::kComputeBound, 10 * kGiB)};
    all.push_back(s);
  }
  {  // Crashes while holding, while waiting, while being revoked; some come back.
    Scenario s = base("crashing clients");
    for (int i = 0; i < 5; ++i) {
      ClientSpec c = client(Behaviour::kCrashing, (3 + 2 * i) * kGiB, i % 2 ? 30 : 100);
      c.crash_at = 700ms + i * 2300ms;
      c.reconnects = true;
      s.clients.push_back(c);
    }
    all.push_back(s);
  }
  {  // Limits (caps and memory) change every second while everyone works.
    Scenario s = base("limits changed mid-run");
    s.limit_change_every = 1s;
    s.clients = {client(Behaviour::kComputeBound, 2 * kGiB, 30),
                 client(Behaviour::kComputeBound, 3 * kGiB),
                 client(Behaviour::kBursty, 5 * kGiB, 60)};
    all.push_back(s);
  }
  {  // A client larger than the GPU among small ones: it runs alone, the others are not starved.
    Scenario s = base("oversize client");
    s.clients = {client(Behaviour::kComputeBound, 2 * kGiB),
                 client(Behaviour::kComputeBound, 20 * kGiB),
                 client(Behaviour::kComputeBound, 3 * kGiB), client(Behaviour::kBursty, 1 * kGiB)};
    all.push_back(s);
  }
  {  // Exclusive mode: two small clients alternate quantum by quantum, nothing swaps.
    Scenario s = base("exclusive alternation");
    s.config.mode = Mode::kExclusive;
    s.clients = {client(Behaviour::kComputeBound, 2 * kGiB),
                 client(Behaviour::kComputeBound, 2 * kGiB)};
    all.push_back(s);
  }
  {  // Exclusive mode: a job of short steps (it honours yields) beside one that never idles.
    Scenario s = base("exclusive steps beside a trainer");
    s.config.mode = Mode::kExclusive;
    ClientSpec steps = client(Behaviour::kComputeBound, 2 * kGiB);
    steps.step = 3ms;
    s.clients = {client(Behaviour::kComputeBound, 2 * kGiB), steps};
    all.push_back(s);
  }
  {  // Auto quantum from measured swap bandwidth, large clients that never fit together.
    Scenario s = base("auto quantum with swaps");
    s.config.fixed_quantum.reset();
    s.config.quantum_min = 500ms;
    s.config.quantum_max = 4s;
    for (int i = 0; i < 3; ++i) s.clients.push_back(client(Behaviour::kComputeBound, 9 * kGiB));
    all.push_back(s);
  }
  {  // Many bursty and idle clients: work conservation under churn.
    Scenario s = base("bursty crowd");
    for (int i = 0; i < 8; ++i) {
      s.clients.push_back(client(i % 3 ? Behaviour::kBursty : Behaviour::kIdle,
                                 (1 + i % 4) * 2 * kGiB, i % 2 ? 20 + 10 * i : 100));
      s.clients.back().start = i * 300ms;
    }
    s.stale_releases = true;
    all.push_back(s);
  }
  {  // Capped clients that do not fit together: quota turns with swaps.
    Scenario s = base("capped large clients");
    s.config.fixed_quantum = 5s;  // long turns: the caps end most runs, not the quantum
    s.clients = {client(Behaviour::kComputeBound, 9 * kGiB, 30),
                 client(Behaviour::kComputeBound, 9 * kGiB, 40),
                 client(Behaviour::kComputeBound, 2 * kGiB, 50)};
    all.push_back(s);
  }
  {  // Working sets grow and shrink while co-running: overflow revokes keep runners within usable.
    Scenario s = base("growing working sets");
    for (int i = 0; i < 4; ++i) {
      ClientSpec c = client(Behaviour::kComputeBound, 4 * kGiB);
      c.grows = true;
      s.clients.push_back(c);
    }
    all.push_back(s);
  }
  return all;
}

namespace {

Scenario cap_scenario(const std::string& name, std::uint64_t seed, const std::vector<int>& caps) {
  Scenario s;
  s.name = name;
  s.seed = seed;
  s.config.mode = Mode::kAuto;          // caps are measured while everyone runs together
  s.config.capacity_bytes = 16 * kGiB;  // 1Gi each: all fit together
  s.length = 60s;
  for (int cap : caps) {
    ClientSpec c;
    c.behaviour = Behaviour::kComputeBound;
    c.working_set = kGiB;
    c.limits.core_percent = static_cast<std::uint8_t>(cap);
    s.clients.push_back(c);
  }
  return s;
}

}  // namespace

std::vector<CapCase> cap_cases() {
  std::vector<CapCase> cases;
  std::uint64_t seed = 1;
  for (int cap = 5; cap <= 100; cap += 5) {
    cases.push_back({"alone", cap_scenario("cap alone", seed++, {cap})});
  }
  Rng rng(2024);
  auto caps_with_sum = [&](int n, bool over) {
    for (;;) {
      std::vector<int> caps;
      int sum = 0;
      for (int i = 0; i < n; ++i) {
        caps.push_back(rng.range(5, 95));
        sum += caps.back();
      }
      if ((sum > 100) == over) return caps;
    }
  };
  const struct {
    const char* category;
    int n;
    bool over;
  } groups[] = {{"two, sum <= 100", 2, false},
                {"two, sum > 100", 2, true},
                {"three, sum <= 100", 3, false},
                {"three, sum > 100", 3, true}};
  for (const auto& g : groups) {
    for (int i = 0; i < 25; ++i) {
      cases.push_back({g.category, cap_scenario(g.category, seed++, caps_with_sum(g.n, g.over))});
    }
  }
  for (int i = 0; i < 25; ++i) {
    const int capped = rng.range(1, 2);
    std::vector<int> caps = caps_with_sum(capped, capped == 2 && rng.chance(0.3));
    caps.push_back(100);
    cases.push_back({"mixed with uncapped", cap_scenario("cap mixed", seed++, caps)});
  }
  // Entitlements beside uncapped clients: a cap above an equal split, caps that leave the uncapped
  // clients only their floor, two uncapped clients sharing the rest, low caps.
  const std::vector<std::vector<int>> entitlements = {{20, 45, 100},  {45, 100},    {60, 50, 100},
                                                      {30, 100, 100}, {10, 30, 50}, {10, 25, 100}};
  for (const std::vector<int>& caps : entitlements) {
    cases.push_back({"entitlements", cap_scenario("cap entitlements", seed++, caps)});
  }
  // Exclusive mode, every client a loop of short steps with a synchronize between them (they
  // honour yields): the turns follow the entitlements.
  const std::vector<std::vector<int>> turns = {{20, 45, 100}, {30, 60},      {50, 50},
                                               {80, 80},      {30, 100},     {10, 30, 50},
                                               {10, 100},     {25, 100, 100}};
  for (const std::vector<int>& caps : turns) {
    Scenario s = cap_scenario("cap exclusive steps", seed++, caps);
    s.config.mode = Mode::kExclusive;
    for (ClientSpec& c : s.clients) c.step = rng.between(2ms, 30ms);
    cases.push_back({"exclusive, steps", s});
  }
  return cases;
}

std::vector<Scenario> fair_turn_cases() {
  std::vector<Scenario> cases;
  Rng rng(77);
  for (std::uint64_t seed = 1; seed <= 40; ++seed) {
    Scenario s;
    s.name = "fair turns";
    s.seed = seed;
    s.config.mode = Mode::kExclusive;
    s.config.capacity_bytes = 16 * kGiB;  // 1Gi each: hand-offs move no memory, yields are sent
    if (rng.chance(0.5)) s.config.fixed_quantum = rng.between(500ms, 5s);  // else auto: 5 s
    s.length = 120s;
    const int n = rng.range(2, 4);
    for (int i = 0; i < n; ++i) {
      ClientSpec c;
      c.behaviour = Behaviour::kComputeBound;
      c.working_set = kGiB;
      // The first never idles, the second always has gaps: every case mixes the two kinds.
      if (i == 1 || (i > 1 && rng.chance(0.5))) c.step = rng.between(1ms, 200ms);
      s.clients.push_back(c);
    }
    cases.push_back(s);
  }
  return cases;
}

}  // namespace nvshare::sim
