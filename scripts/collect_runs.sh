#!/usr/bin/env bash
# Copy each finished run's evaluation and training log of a sweep directory into results/ (small files, committed as
# they land, so an interrupted grid loses nothing). Run paths are made relative to the repository (a sweep records
# absolute ones). Usage: scripts/collect_runs.sh runs/mechanism results/mechanism
set -euo pipefail
src=$1 dst=$2
root=$(cd "$(dirname "$0")/.." && pwd)
for ev in "$src"/*/seed*/eval.json; do
  [ -e "$ev" ] || continue
  run=$(dirname "$ev"); rel=${run#"$src"/}
  mkdir -p "$dst/$rel"
  cp "$ev" "$run/metrics.jsonl" "$dst/$rel/"
  sed -i "s#$root/##g" "$dst/$rel/eval.json" "$dst/$rel/metrics.jsonl"
done
