// The paired simulation (label `sim`): real client GrantSession engines against the real Scheduler
// in virtual time, over named situations and thousands of seeded random scenarios
// (link_simulation.h lists the properties).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string_view>
#include <utility>

#include "client/link/grant_session.h"
#include "link_simulation.h"
#include "sweep_knobs.h"

namespace nvshare::linksim {
namespace {

constexpr std::uint64_t kRandomScenarios = 2000;

void expect_ok(const Scenario& scenario, const Result& result) {
  if (result.ok) return;
  const Result replay = run(scenario, true);
  std::string trace;
  for (const std::string& line : replay.trace) trace += "  " + line + "\n";
  ADD_FAILURE() << describe(scenario) << "\n" << result.failure << "\nlast steps:\n" << trace;
}

// The named scenario `name`, run and checked; none (and a failure) if there is no such scenario.
std::optional<std::pair<Scenario, Result>> run_named(std::string_view name) {
  for (const Scenario& scenario : named_scenarios()) {
    if (scenario.name != name) continue;
    Result result = run(scenario);
    expect_ok(scenario, result);
    return std::make_pair(scenario, std::move(result));
  }
  ADD_FAILURE() << "no scenario named " << name;
  return std::nullopt;
}

TEST(LinkSim, NamedScenarios) {
  for (const Scenario& scenario : named_scenarios()) {
    const Result result = run(scenario);
    expect_ok(scenario, result);
    std::printf(
        "%-48s steps %7llu grants %5llu revokes %5llu swaps %4llu reconnects %3llu "
        "worst wait %.0f ms (bound %.0f)%s\n",
        scenario.name.c_str(), static_cast<unsigned long long>(result.steps),
        static_cast<unsigned long long>(result.grants),
        static_cast<unsigned long long>(result.revokes),
        static_cast<unsigned long long>(result.swaps),
        static_cast<unsigned long long>(result.reconnects), to_ms(result.worst_wait),
        to_ms(result.stuck_bound),
        result.first_share_percent >= 0
            ? (" share " + std::to_string(result.first_share_percent) + "%").c_str()
            : "");
  }
}

// A swap notice (a job waits for this one's memory) hands the end of a turn's work over after
// kNoticedIdle, not the idle release; a job that pauses loses its grant to a pause at most twice,
// since a pause made twice is waited out (client/link/grant_session.h, kNoticedIdle).
TEST(LinkSim, ANoticedEndIsHandedOverSoonAndAPauseAtMostTwice) {
  const auto named = run_named(kNoticedEndsScenario);
  ASSERT_TRUE(named.has_value());
  const auto& [scenario, result] = *named;
  ASSERT_EQ(result.pause_releases.size(), 3u);
  for (std::size_t i = 0; i < 3; ++i) {
    std::printf("client %zu: %d pauses handed over, end released %.1f ms after the work\n", i,
                result.pause_releases[i], to_ms(result.noticed_end_release[i]));
    EXPECT_LE(result.pause_releases[i], 2) << "client " << i;
  }
  // The job that never pauses: released within kNoticedIdle and one look (half of it), plus the
  // simulated delays.
  EXPECT_GE(result.noticed_end_release[2], Duration{0}) << "no noticed end was seen";
  EXPECT_LE(result.noticed_end_release[2],
            client::kNoticedIdle * 3 / 2 + scenario.delay_max + std::chrono::milliseconds(1));
}

// A high service that runs 1 s and pauses 1 s beside a low trainer that never idles: once the
// trainer is held back (its drains delay the service), the service is told (contended) and hands
// each later pause over within kContendedIdle and one look, not after its 100 ms idle release.
TEST(LinkSim, AHighServiceHandsItsPausesToAHeldBackLowerClassSoon) {
  const auto named = run_named(kContendedPausesScenario);
  ASSERT_TRUE(named.has_value());
  const auto& [scenario, result] = *named;
  std::printf(
      "%llu contended; the service handed %d of its pauses over, %d after a notice, "
      "the latest %.1f ms after its work\n",
      static_cast<unsigned long long>(result.contended), result.pause_releases[0],
      result.noticed_pause_releases[0], to_ms(result.noticed_pause_release[0]));
  EXPECT_GT(result.contended, 0u);
  // About ten pauses in 20 s; the first ones may come before the trainer is held back.
  EXPECT_GE(result.noticed_pause_releases[0], 5);
  EXPECT_LE(result.noticed_pause_release[0],
            client::kContendedIdle * 3 / 2 + scenario.delay_max + std::chrono::milliseconds(1));
}

// The same service with launch calls the driver holds for 90 ms now and then (the GPU idle
// meanwhile): those stretches are not learnt as pauses (they would raise the service's threshold
// to its whole idle release), so its pauses still go down within kContendedIdle and one look.
TEST(LinkSim, AStalledLaunchIsNoPause) {
  const auto named = run_named(kStalledLaunchesScenario);
  ASSERT_TRUE(named.has_value());
  const auto& [scenario, result] = *named;
  std::printf(
      "the service handed %d of its pauses over after a notice, the latest %.1f ms after "
      "its work\n",
      result.noticed_pause_releases[0], to_ms(result.noticed_pause_release[0]));
  EXPECT_GE(result.noticed_pause_releases[0], 5);
  EXPECT_LE(result.noticed_pause_release[0],
            client::kContendedIdle * 3 / 2 + scenario.delay_max + std::chrono::milliseconds(1));
}

// Two jobs taking turns with swaps, neither pausing, whose waits for the drain bound the driver
// now and then ends 90 ms late (the GPU idle meanwhile): a thread waiting for its own work is no
// pause of the process, so no turn is handed over early. Without the rule each job hands one such
// stretch over (then it is learnt as a pause).
TEST(LinkSim, ALateWakeAtTheDrainBoundIsNoPause) {
  const auto named = run_named(kLateWakesScenario);
  ASSERT_TRUE(named.has_value());
  const auto& [scenario, result] = *named;
  ASSERT_EQ(result.pause_releases.size(), 2u);
  EXPECT_GT(result.swaps, 2u) << "the jobs did not take turns";
  for (std::size_t i = 0; i < 2; ++i) {
    std::printf("client %zu: %d stretches handed over\n", i, result.pause_releases[i]);
    EXPECT_EQ(result.pause_releases[i], 0) << "client " << i;
  }
}

// The same service with one pause of 60 ms at its start, before the trainer is held back: a pause
// made once is not waited out (it would be, for the rest of the run, at twice its length), so the
// later pauses still go down within kContendedIdle and one look.
TEST(LinkSim, AOneOffPauseKeepsNoLaterPauseFromAHeldBackLowerClass) {
  const auto named = run_named(kOneOffPauseScenario);
  ASSERT_TRUE(named.has_value());
  const auto& [scenario, result] = *named;
  std::printf(
      "the service handed %d of its pauses over after a notice, the latest %.1f ms after its "
      "work\n",
      result.noticed_pause_releases[0], to_ms(result.noticed_pause_release[0]));
  EXPECT_GE(result.noticed_pause_releases[0], 5);
  EXPECT_LE(result.noticed_pause_release[0],
            client::kContendedIdle * 3 / 2 + scenario.delay_max + std::chrono::milliseconds(1));
}

// The same service with 30 ms gaps between its bursts of 100 ms: told that the trainer waits, it
// hands two gaps over at most (a gap made twice is waited out), not one every 130 ms.
TEST(LinkSim, AHighServiceHandsAtMostTwoShortGapsToAHeldBackLowerClass) {
  const auto named = run_named(kContendedGapsScenario);
  ASSERT_TRUE(named.has_value());
  const auto& [scenario, result] = *named;
  std::printf("%llu contended; the service handed %d of its gaps over after a notice\n",
              static_cast<unsigned long long>(result.contended), result.noticed_pause_releases[0]);
  EXPECT_GT(result.contended, 0u);
  EXPECT_LE(result.noticed_pause_releases[0], 2);
}

// Seeds that sweeps beyond the ones every run checks (NVSHARE_SIM_SEED_BASE) found failing, kept
// for good. 3631: a usage report fell due while a revoke waited for a thread inside a submission,
// and the engine's next deadline stayed in the past (a busy loop).
TEST(LinkSim, SeedsSweepsFound) {
  for (std::uint64_t seed : {3631}) {
    const Scenario scenario = random_scenario(seed);
    expect_ok(scenario, run(scenario));
  }
}

TEST(LinkSim, RandomScenarios) {
  const auto start = std::chrono::steady_clock::now();
  Result total;
  int failures = 0;
  const std::uint64_t base = sim::seed_base();
  for (std::uint64_t seed = base + 1; seed <= base + kRandomScenarios && failures < 3; ++seed) {
    const Scenario scenario = random_scenario(seed);
    const Result result = run(scenario);
    if (!result.ok) {
      ++failures;
      expect_ok(scenario, result);
    }
    total.steps += result.steps;
    total.grants += result.grants;
    total.revokes += result.revokes;
    total.swaps += result.swaps;
    total.room_swap_ins += result.room_swap_ins;
    total.idle_releases += result.idle_releases;
    total.yields += result.yields;
    total.swap_notices += result.swap_notices;
    total.reconnects += result.reconnects;
    total.limit_changes += result.limit_changes;
    total.deferred += result.deferred;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "%llu scenarios in %.1f s: %llu engine steps, %llu grants, %llu revokes, %llu swaps, %llu "
      "swap-ins into room, "
      "%llu idle releases, %llu yields, %llu swap notices, %llu reconnects, %llu limit "
      "changes, %llu events deferred during agent work\n",
      static_cast<unsigned long long>(kRandomScenarios), seconds,
      static_cast<unsigned long long>(total.steps), static_cast<unsigned long long>(total.grants),
      static_cast<unsigned long long>(total.revokes), static_cast<unsigned long long>(total.swaps),
      static_cast<unsigned long long>(total.room_swap_ins),
      static_cast<unsigned long long>(total.idle_releases),
      static_cast<unsigned long long>(total.yields),
      static_cast<unsigned long long>(total.swap_notices),
      static_cast<unsigned long long>(total.reconnects),
      static_cast<unsigned long long>(total.limit_changes),
      static_cast<unsigned long long>(total.deferred));
  // Every kind of event happened, so the properties were exercised.
  EXPECT_GT(total.revokes, 1000u);
  EXPECT_GT(total.swaps, 100u);
  EXPECT_GT(total.room_swap_ins, 10u);
  EXPECT_GT(total.idle_releases, 100u);
  EXPECT_GT(total.yields, 10u);
  EXPECT_GT(total.swap_notices, 10u);
  EXPECT_GT(total.reconnects, 100u);
  EXPECT_GT(total.limit_changes, 100u);
  EXPECT_GT(total.deferred, 100u);
}

}  // namespace
}  // namespace nvshare::linksim
