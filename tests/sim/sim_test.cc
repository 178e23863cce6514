// The policy simulation suite (ctest label `sim`): seeded random scenarios, named scenarios and cap
// accuracy. Each random chunk is its own test so ctest can run chunks side by side.
//
// NVSHARE_SIM_SEED=<n> replaces the random chunks by random scenario n alone, its trace printed
// (for debugging: `NVSHARE_SIM_SEED=76 policy_sim --gtest_filter='Seeds/*/0'`).
// NVSHARE_SIM_SEED_BASE=<n> shifts the chunks to seeds n+1 onwards, for sweeps beyond the 10,000
// that every run checks. NVSHARE_SIM_TRACE_LINES=<n> keeps the last n lines of a trace (150).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>

#include "scheduler/policy/gpu_policy.h"
#include "simulation.h"
#include "sweep_knobs.h"

namespace nvshare::sim {
namespace {

constexpr int kChunks = 10;
constexpr int kSeedsPerChunk = 1000;  // 10,000 random scenarios in all

std::string joined(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += "  " + line + "\n";
  return text;
}

// Runs a scenario; on failure replays it with tracing and reports the seed, the policy and the
// trace.
SimResult run_checked(const Scenario& scenario) {
  SimResult result = run_simulation(scenario);
  if (!result.ok) {
    const SimResult traced = run_simulation(scenario, true);
    ADD_FAILURE() << "scenario " << describe(scenario) << "\n"
                  << result.failure << "\nlast events:\n"
                  << joined(traced.trace);
  }
  return result;
}

double secs(Duration d) { return static_cast<double>(d.count()) / 1e9; }

class RandomScenarios : public ::testing::TestWithParam<int> {};

TEST_P(RandomScenarios, PropertiesHold) {
  if (const char* seed = std::getenv("NVSHARE_SIM_SEED")) {
    if (GetParam() != 0) GTEST_SKIP() << "NVSHARE_SIM_SEED is set: chunk 0 replays that seed";
    const Scenario scenario = random_scenario(std::strtoull(seed, nullptr, 10));
    const SimResult result = run_simulation(scenario, true);
    std::printf("%s\n%s", describe(scenario).c_str(), joined(result.trace).c_str());
    EXPECT_TRUE(result.ok) << result.failure;
    return;
  }
  const auto started = std::chrono::steady_clock::now();
  std::uint64_t events = 0, grants = 0, revokes = 0, unresponsive = 0, stale = 0, evictions = 0,
                rooms = 0;
  double worst_ratio = 0;
  Duration worst_latency{0};
  const std::uint64_t first =
      seed_base() + static_cast<std::uint64_t>(GetParam()) * kSeedsPerChunk + 1;
  for (std::uint64_t seed = first; seed < first + kSeedsPerChunk; ++seed) {
    const Scenario scenario = random_scenario(seed);
    const SimResult r = run_checked(scenario);
    if (!r.ok) return;
    events += r.engine_events;
    grants += r.grants;
    revokes += r.revokes;
    unresponsive += r.unresponsive;
    stale += r.stale_releases;
    evictions += r.evictions;
    rooms += r.rooms;
    worst_ratio = std::max(worst_ratio, secs(r.worst_wait) / secs(r.starvation_bound));
    worst_latency = std::max(worst_latency, r.worst_limit_latency);
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf(
      "seeds %llu..%llu: %llu engine events, %llu grants, %llu revokes, %llu unresponsive, %llu "
      "stale "
      "releases, %llu evictions, %llu rooms; worst wait %.1f%% of the starvation bound; worst "
      "limit latency "
      "%.3f s; %.2f s\n",
      static_cast<unsigned long long>(first),
      static_cast<unsigned long long>(first + kSeedsPerChunk - 1),
      static_cast<unsigned long long>(events), static_cast<unsigned long long>(grants),
      static_cast<unsigned long long>(revokes), static_cast<unsigned long long>(unresponsive),
      static_cast<unsigned long long>(stale), static_cast<unsigned long long>(evictions),
      static_cast<unsigned long long>(rooms), worst_ratio * 100, secs(worst_latency), elapsed);
  // Clients keep memory on the device without a grant in these mixes, and heads are given room:
  // the device-memory properties and the bounded waits for evictions are exercised, not vacuous.
  EXPECT_GT(evictions, 0u);
  EXPECT_GT(rooms, 0u);
}

INSTANTIATE_TEST_SUITE_P(Seeds, RandomScenarios, ::testing::Range(0, kChunks));

// Seeds that sweeps beyond the chunks (NVSHARE_SIM_SEED_BASE) found failing, kept for good. Each
// has a holder that ignored its revoke: a high-class one held every lower class back for ever, or
// one the priority floor had let through stopped the floor for the rest, or restarted it with its
// late release; or (36520) the client in quota debt after it, whose memory waits between a capped
// client's pauses are its debt's (docs/scheduling.md, "The starvation bound").
TEST(Simulation, SeedsSweepsFound) {
  for (std::uint64_t seed : {36520, 57102, 72237, 84905, 99782, 101128, 120247, 126896, 138156}) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    (void)run_checked(random_scenario(seed));
  }
}

TEST(Simulation, NamedScenarios) {
  for (const Scenario& scenario : named_scenarios()) {
    SCOPED_TRACE(scenario.name);
    const SimResult r = run_checked(scenario);
    if (!r.ok) continue;
    std::printf(
        "%-26s %5llu grants %5llu revokes (%llu quota, %llu swap-out) %llu unresponsive, "
        "worst wait %.2f s of %.2f s bound\n",
        scenario.name.c_str(), static_cast<unsigned long long>(r.grants),
        static_cast<unsigned long long>(r.revokes),
        static_cast<unsigned long long>(r.quota_revokes),
        static_cast<unsigned long long>(r.swap_outs),
        static_cast<unsigned long long>(r.unresponsive), secs(r.worst_wait),
        secs(r.starvation_bound));
    EXPECT_GT(r.grants, 10u);
    if (scenario.name == "hung holder" || scenario.name == "hung holder wakes up") {
      EXPECT_GE(r.unresponsive, 1u);
    }
    if (scenario.name == "exclusive steps beside a trainer") {
      // The client with idle gaps honours every yield; it still gets its half.
      for (const ConnectionOutcome& o : r.connections) {
        EXPECT_GE(o.billed_seconds / secs(scenario.length), 0.45) << o.label;
      }
    }
    if (scenario.name == "exclusive alternation") {
      EXPECT_EQ(r.swap_outs, 0u);  // they fit together: turns without moving memory
      EXPECT_GT(r.revokes, 40u);
    }
    if (scenario.name == "auto quantum with swaps") {
      EXPECT_GT(r.swap_outs, 5u);
    }
    if (scenario.name == "capped large clients") {
      EXPECT_GT(r.quota_revokes, 10u);
    }
    if (scenario.name == "limits changed mid-run") {
      EXPECT_GT(r.limit_changes, 40u);
      EXPECT_LE(r.worst_limit_latency, std::chrono::seconds(1));
    }
    if (scenario.name == "crashing clients") {
      EXPECT_GE(r.connections.size(), 10u);
    }
    if (scenario.name == "growing working sets") {
      EXPECT_GT(r.revokes, 5u);
    }
  }
}

// The share each client should get: a cap is an entitlement. The capped clients' caps, scaled down
// when they sum over what they may have together (all of the GPU, or kCappedRoomBesideUncapped of
// it beside uncapped clients); the uncapped clients split the rest equally.
std::vector<double> expected_shares(const std::vector<int>& caps) {
  int capped_sum = 0;
  int uncapped = 0;
  for (int c : caps) {
    if (c < 100) {
      capped_sum += c;
    } else {
      ++uncapped;
    }
  }
  const double room = uncapped > 0 ? policy::kCappedRoomBesideUncapped : 1.0;
  const double capped = capped_sum / 100.0;
  const double scale = capped > room ? room / capped : 1.0;
  std::vector<double> share;
  for (int c : caps) {
    share.push_back(c < 100 ? c / 100.0 * scale : (1.0 - capped * scale) / uncapped);
  }
  return share;
}

std::vector<int> caps_of(const Scenario& scenario) {
  std::vector<int> caps;
  for (const ClientSpec& spec : scenario.clients) caps.push_back(spec.limits.core_percent);
  return caps;
}

TEST(Simulation, CapAccuracyOverSixtySeconds) {
  struct Worst {
    int cases = 0;
    double capped = 0;    // points
    double uncapped = 0;  // points
    std::string where;
  };
  std::map<std::string, Worst> table;
  std::vector<std::string> order;
  for (const CapCase& c : cap_cases()) {
    const SimResult r = run_checked(c.scenario);
    if (!r.ok) continue;
    const std::vector<int> caps = caps_of(c.scenario);
    const std::vector<double> expected = expected_shares(caps);
    if (!table.count(c.category)) order.push_back(c.category);
    Worst& w = table[c.category];
    ++w.cases;
    ASSERT_EQ(r.connections.size(), caps.size());
    for (std::size_t i = 0; i < caps.size(); ++i) {
      const double share = r.connections[i].billed_seconds / secs(c.scenario.length);
      const double error = std::abs(share - expected[i]) * 100;
      std::string where = "caps";
      for (int cap : caps) where += " " + std::to_string(cap);
      if (caps[i] < 100) {
        if (error > w.capped)
          w.where = where + ": client " + std::to_string(i + 1) + " got " +
                    std::to_string(share * 100) + "%, expected " +
                    std::to_string(expected[i] * 100) + "%";
        w.capped = std::max(w.capped, error);
        EXPECT_LE(error, 1.0) << c.category << ", " << where << ": client " << i + 1 << " got "
                              << share * 100 << "%, expected " << expected[i] * 100 << "%, idle "
                              << secs(r.idle_while_waiting) << " s";
      } else {
        w.uncapped = std::max(w.uncapped, error);
        EXPECT_LE(error, 1.0) << c.category << ", " << where << ": uncapped client " << i + 1
                              << " got " << share * 100 << "%, expected " << expected[i] * 100
                              << "%";
      }
    }
  }
  std::printf("cap accuracy over 60 s (worst |share - expected| in points):\n");
  for (const std::string& category : order) {
    const Worst& w = table[category];
    std::printf("  %-22s %3d cases  capped %.2f  uncapped %.2f   (%s)\n", category.c_str(), w.cases,
                w.capped, w.uncapped, w.where.c_str());
  }
}

// The same mixes over short windows (a user's benchmark, a dashboard's rate): every 8 s window
// after the first 2 s, per category of mix. Turns that move no memory follow the fair clocks in
// slices far shorter than a quantum, and a bucket whose client keeps its memory on the device runs
// it in cycles of a slice, not of a window: 95% of the windows see each client within 2 points of
// its entitlement and none is off by more than 4.5 (with 5 s turns and window-long cycles: 5.4
// and 7.9).
TEST(Simulation, CapAccuracyOverEightSecondWindows) {
  constexpr int kWindow = 8;
  std::map<std::string, std::vector<double>> errors;  // by category, every client and window
  std::map<std::string, std::string> worst_where;
  for (const CapCase& c : cap_cases()) {
    const SimResult r = run_checked(c.scenario);
    if (!r.ok) continue;
    const std::vector<int> caps = caps_of(c.scenario);
    const std::vector<double> expected = expected_shares(caps);
    ASSERT_EQ(r.connections.size(), caps.size());
    const int length = static_cast<int>(secs(c.scenario.length));
    std::vector<double>& category = errors[c.category];
    for (std::size_t i = 0; i < caps.size(); ++i) {
      const std::vector<double>& billed = r.connections[i].billed_per_second;
      for (int from = 2; from + kWindow <= length; ++from) {
        double sum = 0;
        for (int k = from; k < from + kWindow && k < static_cast<int>(billed.size()); ++k) {
          sum += billed[static_cast<std::size_t>(k)];
        }
        const double error = std::abs(sum / kWindow - expected[i]) * 100;
        if (category.empty() || error > *std::max_element(category.begin(), category.end())) {
          worst_where[c.category] = describe(c.scenario) + ": client " + std::to_string(i + 1) +
                                    " got " + std::to_string(100 * sum / kWindow) + "% in [" +
                                    std::to_string(from) + " s, " + std::to_string(from + kWindow) +
                                    " s), expected " + std::to_string(100 * expected[i]) + "%";
        }
        category.push_back(error);
      }
    }
  }
  std::printf("cap accuracy over 8 s windows (|share - expected| in points):\n");
  for (auto& [category, e] : errors) {
    std::sort(e.begin(), e.end());
    const double p50 = e[e.size() / 2];
    const double p95 = e[e.size() * 95 / 100];
    std::printf("  %-22s %5zu windows  p50 %.2f  p95 %.2f  worst %.2f\n", category.c_str(),
                e.size(), p50, p95, e.back());
    // With 0.5 s cap cycles these were p95 1.39 and worst 2.30 (docs/scheduling.md).
    EXPECT_LE(p95, 1.2) << category;
    EXPECT_LE(e.back(), 2.0) << category << ": " << worst_where[category];
  }
}

// Exclusive mode: clients that all want the GPU all the time get equal shares whether or not they
// leave idle gaps (and so honour yields). A holder is asked to yield only once it has had as much
// of the GPU as the client that would run next, so the one that idles between steps is not handed
// over at every gap while the other keeps whole quanta.
TEST(Simulation, FairTurnsInExclusiveMode) {
  double worst = 0;
  std::string where;
  int clients = 0;
  for (const Scenario& s : fair_turn_cases()) {
    const SimResult r = run_checked(s);
    if (!r.ok) continue;
    ASSERT_EQ(r.connections.size(), s.clients.size());
    const double n = static_cast<double>(s.clients.size());
    const double length = secs(s.length);
    const double quantum = secs(s.config.fixed_quantum.value_or(s.config.quantum_max));
    for (std::size_t i = 0; i < s.clients.size(); ++i) {
      ++clients;
      const double billed = r.connections[i].billed_seconds;
      const double in_quanta = (length / n - billed) / quantum;
      const std::string what = describe(s) + ": client " + std::to_string(i + 1) + " got " +
                               std::to_string(100 * billed / length) + "% of the GPU";
      EXPECT_LE(in_quanta, 2.0) << what;
      if (in_quanta > worst) {
        worst = in_quanta;
        where = what;
      }
    }
  }
  std::printf(
      "fair turns: %d clients in 40 mixes; worst shortfall from an equal share %.2f quanta\n  "
      "(%s)\n",
      clients, worst, where.c_str());
}

// Mode auto with pace reports: saturating clients take turns (the simulator checks after every
// event that no two of them run together), each getting an equal part of what it is billed at; the
// others run beside whoever holds the GPU and never wait.
TEST(Simulation, SaturatingClientsTakeTurnsInModeAuto) {
  double worst = 0;
  std::string where;
  for (const Scenario& s : saturating_cases()) {
    const SimResult r = run_checked(s);
    if (!r.ok) continue;
    ASSERT_EQ(r.connections.size(), s.clients.size());
    int saturating = 0;
    for (const ClientSpec& c : s.clients) saturating += c.pace == 1000 ? 1 : 0;
    const int interactive = static_cast<int>(s.clients.size()) - saturating;
    const double length = secs(s.length);
    // One saturating client and every interactive one hold at any time, billed 1/n each.
    const double per_holder = length / (1 + interactive);
    for (std::size_t i = 0; i < s.clients.size(); ++i) {
      const double billed = r.connections[i].billed_seconds;
      const bool sat = s.clients[i].pace == 1000;
      const double expected = sat ? per_holder / saturating : per_holder;
      const double error = std::abs(billed - expected) / length;
      const std::string what = describe(s) + ": client " + std::to_string(i + 1) + " billed " +
                               std::to_string(billed) + " s, expected " + std::to_string(expected);
      EXPECT_LE(error, 0.02) << what;
      if (error > worst) {
        worst = error;
        where = what;
      }
    }
    if (interactive == 0) {
      EXPECT_LT(secs(r.together), 0.01 * length)
          << describe(s) << ": saturating clients overlapped";
    } else {
      EXPECT_GT(secs(r.together), 0.95 * length) << describe(s) << ": interactive clients waited";
    }
  }
  std::printf("saturating turns: worst error %.2f%% of the run (%s)\n", 100 * worst, where.c_str());
}

// A turn that ends with a swap-out is announced as soon as it is planned (the head of the queue
// waits for it), so the runner makes its host copies during its turn and its swap-out moves memory
// at copy speed: no swap-out waits for host copies, and every notice leads its revoke by more than
// the time they take (10 GiB at 4.6 GB/s: 2.3 s; the quantum is at least 5 s).
TEST(Simulation, SwapOutsForTurnsAreAnnouncedInTime) {
  for (const Scenario& s : swap_turn_cases()) {
    const SimResult r = run_checked(s);
    if (!r.ok) continue;
    std::printf("%s: %llu swap-outs for turns, %llu announced, least lead %.2f s\n",
                describe(s).c_str(), static_cast<unsigned long long>(r.turn_swap_outs),
                static_cast<unsigned long long>(r.noticed_swap_outs),
                r.noticed_swap_outs > 0 ? secs(r.least_notice_lead) : 0.0);
    EXPECT_GE(r.turn_swap_outs, 4u) << describe(s);
    EXPECT_EQ(r.noticed_swap_outs, r.turn_swap_outs) << describe(s);
    EXPECT_GE(secs(r.least_notice_lead), 10.0 * 1.073741824 / 4.6) << describe(s);
    EXPECT_EQ(r.host_copy_waits, Duration{0}) << describe(s);
  }
}

// The auto quantum is k times a hand-off's swap time (out and in), so that swaps take about
// 1 / (k + 1) of the GPU's time (2% with the default k = 50) while the quantum lies between its
// bounds or below them; drains come on top (0-50 ms each here).
TEST(Simulation, SwapsTakeTheShareTheQuantumAllows) {
  for (const Scenario& s : swap_share_cases()) {
    const SimResult r = run_checked(s);
    if (!r.ok) continue;
    const double length = secs(s.length);
    const double swaps = secs(r.swap_time) / length;
    const double handoffs = secs(r.handoff_time) / length;
    std::printf("%s: %llu swap-outs, swaps %.2f%% of the time, hand-offs with drains %.2f%%\n",
                describe(s).c_str(), static_cast<unsigned long long>(r.swap_outs), 100 * swaps,
                100 * handoffs);
    EXPECT_GE(r.swap_outs, 15u) << describe(s);
    EXPECT_LE(swaps, 1.0 / 51 + 0.002) << describe(s);  // the default k = 50
    EXPECT_LE(handoffs, 0.03) << describe(s);
  }
}

// Room: two 10 GiB jobs that take byte targets (pieces of 1 GiB) under 16 GiB take turns. A head
// that takes room brings its memory back while the leaver drains and swaps out (the leaver reports
// each piece as it goes), so the hand-offs take less time than with the head swapping in after
// the release; the room never puts the device over usable memory (checked at every room given)
// and the grants never do either (checked at every grant).
TEST(Simulation, RoomOverlapsTheHeadsSwapInWithTheLeaversSwapOut) {
  using namespace std::chrono_literals;
  for (const policy::Mode mode : {policy::Mode::kAuto, policy::Mode::kExclusive}) {
    Duration handoffs[2]{};
    for (const bool room : {false, true}) {
      Scenario s;
      s.name = std::string("two 10 GiB jobs in pieces, ") + (room ? "room" : "no room");
      s.seed = 5;
      s.config.mode = mode;
      s.config.capacity_bytes = 16 * kGiB;
      s.length = 120s;
      for (int i = 0; i < 2; ++i) {
        ClientSpec c;
        c.working_set = 10 * kGiB;
        c.chunk = kGiB;
        c.takes_room = room;
        c.swap_bytes_per_s = 50e9;
        c.start = 100ms * i;
        s.clients.push_back(c);
      }
      const SimResult r = run_checked(s);
      if (!r.ok) return;
      std::printf("%s: %llu swap-outs, %llu rooms (%.1f GiB back ahead), hand-offs %.3f s\n",
                  describe(s).c_str(), static_cast<unsigned long long>(r.swap_outs),
                  static_cast<unsigned long long>(r.rooms),
                  static_cast<double>(r.room_bytes) / static_cast<double>(kGiB),
                  secs(r.handoff_time));
      EXPECT_GE(r.swap_outs, 4u) << describe(s);
      if (room) {
        EXPECT_GE(r.rooms, r.swap_outs) << describe(s);
        EXPECT_GE(r.room_bytes, r.swap_outs * 3 * kGiB) << describe(s);
      } else {
        EXPECT_EQ(r.rooms, 0u) << describe(s);
      }
      handoffs[room ? 1 : 0] = r.handoff_time;
    }
    EXPECT_LT(secs(handoffs[1]), 0.8 * secs(handoffs[0]));
  }
}

// A job's class follows its reports, live: a client that becomes saturating starts taking turns
// with the saturating one, and one that stops saturating runs beside it again.
TEST(Simulation, TheClassFollowsAJobAsItChanges) {
  using namespace std::chrono_literals;
  Scenario s;
  s.name = "paces change";
  s.seed = 1;
  s.config.mode = policy::Mode::kAuto;
  s.config.capacity_bytes = 16 * kGiB;
  s.length = 60s;
  ClientSpec steady;
  steady.working_set = 2 * kGiB;
  steady.pace = 1000;
  ClientSpec joins = steady;  // interactive, saturating from 20 s
  joins.pace = 0;
  joins.step = 2ms;
  joins.pace_change_at = 20s;
  joins.later_pace = 1000;
  ClientSpec leaves = steady;  // saturating, interactive from 40 s
  leaves.pace_change_at = 40s;
  leaves.later_pace = 0;
  s.clients = {steady, joins, leaves};
  const SimResult r = run_checked(s);
  ASSERT_TRUE(r.ok);
  ASSERT_GE(r.together_per_second.size(), 59u);
  auto together = [&](int from, int to) {
    double sum = 0;
    for (int k = from; k < to; ++k) sum += r.together_per_second[static_cast<std::size_t>(k)];
    return sum / (to - from);
  };
  EXPECT_GT(together(1, 20), 0.95) << "an interactive client ran beside the saturating ones";
  EXPECT_LT(together(21, 40), 0.02) << "three saturating clients took turns";
  EXPECT_GT(together(41, 60), 0.95) << "the one that stopped saturating ran beside again";
  std::printf("paces change: together %.2f / %.2f / %.2f of each second\n", together(1, 20),
              together(21, 40), together(41, 60));
}

// Priority classes: a high client waits for a grant no longer than a lower class's drain (and
// swap-out, when they do not fit together), is never swapped out for a lower class, and a low
// client runs in the time the higher classes leave; the simulator checks after every event that no
// lower class runs while a higher one waits and that no grant leaves two classes holding together.
TEST(Simulation, PriorityClasses) {
  using namespace std::chrono_literals;
  for (const PriorityCase& pc : priority_cases()) {
    const Scenario& s = pc.scenario;
    const SimResult r = run_checked(s);
    if (!r.ok) continue;
    const ConnectionOutcome* high = nullptr;
    const ConnectionOutcome* low = nullptr;
    for (const ConnectionOutcome& o : r.connections) {
      if (o.label.find(", high)") != std::string::npos) high = &o;
      if (o.label.find(", low)") != std::string::npos) low = &o;
    }
    ASSERT_NE(high, nullptr) << s.name;
    ASSERT_NE(low, nullptr) << s.name;
    EXPECT_LE(high->worst_wait, pc.high_wait_bound)
        << s.name << ": the high client waited " << secs(high->worst_wait) << " s";
    EXPECT_EQ(high->swap_outs, 0u) << s.name << ": the high client was swapped out";
    auto low_between = [&](Duration from, Duration to) {
      double sum = 0;
      for (auto k = from / 1s; k < to / 1s; ++k) {
        if (static_cast<std::size_t>(k) < low->billed_per_second.size()) {
          sum += low->billed_per_second[static_cast<std::size_t>(k)];
        }
      }
      return sum;
    };
    double worst_window = 1e9;
    if (pc.low_per_window > 0) {
      for (Duration from = pc.low_runs_from; from + 5s <= s.length; from += 5s) {
        const double had = low_between(from, from + 5s);
        worst_window = std::min(worst_window, had);
        EXPECT_GE(had, pc.low_per_window) << s.name << ": the low client had " << had
                                          << " s of GPU in the 5 s from " << secs(from) << " s";
      }
    }
    if (pc.high_shared_max >= 0) {
      EXPECT_LE(secs(high->shared_with_lower), pc.high_shared_max)
          << s.name << ": the low client's drains overlapped the high client's steps for "
          << secs(high->shared_with_lower) << " s";
    }
    if (pc.high_slowed_max >= 0) {
      EXPECT_LE(static_cast<double>(high->steps_slowed), pc.high_slowed_max)
          << s.name << ": the low client's drains slowed " << high->steps_slowed
          << " of the high client's steps";
    }
    if (pc.low_waits_until > 0s) {
      EXPECT_LE(low_between(1s, pc.low_waits_until), pc.low_before)
          << s.name << ": the low client ran while the high one had work";
    }
    std::printf(
        "%s: high waited at most %.2f ms and shared the GPU with a lower class for %.3f s (%llu "
        "steps slowed); low had %.2f s of GPU, at least %.3f s per 5 s window; %llu contended\n",
        s.name.c_str(), 1e3 * secs(high->worst_wait), secs(high->shared_with_lower),
        static_cast<unsigned long long>(high->steps_slowed), low->billed_seconds,
        worst_window < 1e9 ? worst_window : 0.0, static_cast<unsigned long long>(r.contended));
  }
}

}  // namespace
}  // namespace nvshare::sim
