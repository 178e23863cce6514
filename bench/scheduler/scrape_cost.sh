#!/usr/bin/env bash
# What scraping GET /metrics costs the scheduler's decisions: scheduler_bench runs without metrics,
# scraped every second and scraped every 15 s, interleaved (none, 1 s, 15 s, none, ...) so that a
# machine's drift falls on all three alike, and prints each configuration's decision latency p99
# (median and spread over the runs) and scrape times.
#
#   bench/scheduler/scrape_cost.sh BUILD_DIR [ROUNDS] [SECONDS]   (defaults: 4 rounds of 20 s)
#
# Writes every run's JSON to $OUT (or BUILD_DIR/scrape-cost) and the summary to summary.json there.
set -euo pipefail
build=${1:?usage: scrape_cost.sh BUILD_DIR [ROUNDS] [SECONDS]}
rounds=${2:-4}
seconds=${3:-20}
out=${OUT:-$build/scrape-cost}
mkdir -p "$out"
bench="$build/bench/scheduler/scheduler_bench"
for round in $(seq 1 "$rounds"); do
  for scrape in 0 1000 15000; do
    args=(--seconds "$seconds" --out "$out/run-$round-$scrape.json")
    [ "$scrape" != 0 ] && args+=(--scrape-ms "$scrape")
    "$bench" "${args[@]}" >"$out/run-$round-$scrape.txt" 2>&1
  done
done
python3 - "$out" <<'PY'
import glob, json, statistics, sys
out = sys.argv[1]
rows = {}
for f in sorted(glob.glob(f"{out}/run-*.json")):
    scrape = int(f.rsplit("-", 1)[1].split(".")[0])
    r = json.load(open(f))
    rows.setdefault(scrape, []).append(r)
summary = {}
for scrape, runs in sorted(rows.items()):
    p99 = [r["decision_latency_us"]["p99"] for r in runs]
    s = {"runs": len(runs), "p99_us": p99, "p99_median_us": statistics.median(p99)}
    scrapes = [r["metrics_scrape"] for r in runs if r.get("metrics_scrape")]
    if scrapes:
        s["scrape_p50_ms"] = [x.get("p50_ms") for x in scrapes]
        s["scrape_max_ms"] = max(x.get("max_ms", 0) for x in scrapes)
    summary["none" if scrape == 0 else f"every {scrape} ms"] = s
    print(f"{'no metrics' if scrape == 0 else f'scraped every {scrape} ms':24s} p99 median "
          f"{s['p99_median_us']:.1f} us over {len(p99)} runs ({min(p99):.1f}-{max(p99):.1f})"
          + (f"; scrape p50 {s['scrape_p50_ms']} ms, max {s['scrape_max_ms']:.1f} ms" if scrapes else ""))
base = summary["none"]["p99_median_us"]
for k, s in summary.items():
    if k != "none":
        print(f"{k}: p99 median - no metrics = {s['p99_median_us'] - base:+.1f} us")
json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)
PY
