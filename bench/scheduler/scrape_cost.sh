#!/usr/bin/env bash
# What scraping GET /metrics costs the scheduler's decisions. For each load, one scheduler_bench
# run whose measured phase alternates windows scraped every second with windows not scraped
# (--alternate-s): each window's decision latency comes from the daemon, and each scraped window's
# p99 is compared with its unscraped neighbours', so drift falls on both arms alike.
#
#   bench/scheduler/scrape_cost.sh BUILD_DIR [SECONDS] [WINDOW_S]   (defaults: 120 s, 5 s windows)
#
# Loads: the bench's default (1,000 clients over 8 GPUs, think 20 ms: the loop of a small machine
# saturates) and a node-like one (think 200 ms). Writes each run's JSON and output to $OUT (or
# BUILD_DIR/scrape-cost) and the summary to summary.json there.
set -euo pipefail
build=${1:?usage: scrape_cost.sh BUILD_DIR [SECONDS] [WINDOW_S]}
seconds=${2:-120}
window=${3:-5}
out=${OUT:-$build/scrape-cost}
mkdir -p "$out"
bench="$build/bench/scheduler/scheduler_bench"
for think in 20 200; do
  "$bench" --seconds "$seconds" --think-ms "$think" --scrape-ms 1000 --alternate-s "$window" \
    --out "$out/think-$think.json" >"$out/think-$think.txt" 2>&1
done
python3 - "$out" <<'PY'
import glob, json, sys
out = sys.argv[1]
summary = {}
for f in sorted(glob.glob(f"{out}/think-*.json")):
    r = json.load(open(f))
    a = r["alternating"]
    s = {k: a[k] for k in a if k != "windows"}
    s["think_ms_mean"] = r["think_ms_mean"]
    s["daemon_cpu_percent"] = r["daemon_cpu_percent"]
    s["messages_per_s"] = r["messages_per_s"]
    s["scrape"] = r.get("metrics_scrape")
    s["machine"] = r["machine"]
    summary[f"think {r['think_ms_mean']:g} ms"] = s
    print(f"think {r['think_ms_mean']:g} ms ({r['messages_per_s']:.0f} msgs/s, loop "
          f"{r['daemon_cpu_percent']:.0f}% of a core): p99 scraped {a['scraped_p99_median_us']:.1f} us, "
          f"unscraped {a['unscraped_p99_median_us']:.1f} us; scraped - neighbours median "
          f"{a['p99_difference_median_us']:+.1f} us (quartiles {a['p99_difference_p25_us']:+.1f} .. "
          f"{a['p99_difference_p75_us']:+.1f}, {a['pairs']} pairs); scrape p50 "
          f"{s['scrape']['p50_ms']:.1f} ms, max {s['scrape']['max_ms']:.1f} ms, snapshot p50 "
          f"{s['scrape']['snapshot_p50_ms']:.2f} ms")
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
PY
