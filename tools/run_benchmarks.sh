#!/usr/bin/env bash
# Runs every benchmark of docs/benchmarks.md with its final settings, writes the JSON files to docs/ and the
# plots to docs/images/. Run it on a quiet machine (2 cores here: anything else running skews the figures).
# About 10-15 minutes in all; each step stays well under 10 minutes.
#   tools/run_benchmarks.sh            # everything
#   QUICK=1 tools/run_benchmarks.sh    # small sizes, results to /tmp/tf_ext_bench (smoke test, ~2 min)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [[ "${QUICK:-0}" == 1 ]]; then OUT=/tmp/tf_ext_bench; Q=--quick; else OUT=docs; Q=; fi
mkdir -p "$OUT/images"
uptime
$PY tools/bench_table.py $Q --json "$OUT/bench_table.json"
$PY tools/bench_table_memory.py $Q --json "$OUT/bench_table_memory.json"
$PY tools/bench_ctr_speed.py $Q --optimizer adagrad adam --json "$OUT/bench_ctr.json"
$PY tools/bench_ctr_quality.py $Q --json "$OUT/bench_ctr_quality.json"
$PY tools/plot_benchmarks.py --table "$OUT/bench_table.json" --memory "$OUT/bench_table_memory.json" \
    --ctr "$OUT/bench_ctr.json" --out "$OUT/images"
uptime
