#!/usr/bin/env bash
# Copy each finished run's evaluation and training log of a sweep directory into results/ (small files, committed as
# they land, so an interrupted grid loses nothing). Usage: scripts/collect_runs.sh runs/mechanism results/mechanism
set -euo pipefail
src=$1 dst=$2
for ev in "$src"/*/seed*/eval.json; do
  [ -e "$ev" ] || continue
  run=$(dirname "$ev"); rel=${run#"$src"/}
  mkdir -p "$dst/$rel"
  cp "$ev" "$run/metrics.jsonl" "$dst/$rel/"
done
