#!/usr/bin/env bash
# Rerun every analysis of the shipped checkpoints whose output README and docs quote: study/results/{gradients,
# attributions,probes,shortcuts}/, figures/ and the executed notebooks. Run it after a file in checkpoints/ changes.
# Each step is one of the commands the docs give, at the study's sizes (--full-lookahead, probes --full: the
# commands' defaults are smaller, to answer within ~30 s each); it takes tens of minutes of CPU.
# Then study/scripts/compact_results.py trims study/results/ to what the docs quote.
# Usage: study/scripts/analyze_shipped.sh [STEP ...]   (steps: gradients attributions probes shortcuts figures notebooks;
# default all)
set -euo pipefail
cd "$(dirname "$0")/../.."  # the repository root
PY=${PYTHON:-$PWD/.venv/bin/python}
export MPLBACKEND=Agg
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(gradients attributions probes shortcuts figures notebooks)
hybrids=(checkpoints/hybrid-joint.pt checkpoints/hybrid-dat.pt)

# write stdout to FILE only when the command succeeds (no half-written result, also when the script is killed)
tmp=""
trap '[ -z "$tmp" ] || rm -f "$tmp"' EXIT
trap "exit 130" INT
trap "exit 143" TERM
to() {
  local file=$1; shift
  tmp=$(mktemp "$file.XXXX")
  if "$@" > "$tmp"; then chmod a+r "$tmp"; mv "$tmp" "$file"; tmp=""; else rm -f "$tmp"; tmp=""; return 1; fi
}

for step in "${steps[@]}"; do
  echo "=== $step ($(date +%T))" >&2
  case $step in
    gradients)
      to study/results/gradients/trajectories_shipped.json $PY -m probe.gradients checkpoints/trajectories/hybrid-joint \
        checkpoints/trajectories/hybrid-dat --full-lookahead --json
      to study/results/gradients/final_shipped.json $PY -m probe.gradients "${hybrids[@]}" --full-lookahead --json ;;
    attributions)
      to study/results/attributions/final_shipped.json $PY -m probe.attributions "${hybrids[@]}" --json
      to study/results/attributions/final_ig_L25_shipped.json $PY -m probe.attributions "${hybrids[@]}" --lengths 25 --ig --json ;;
    probes)
      $PY -m probe.probes checkpoints/*.pt --full --json --out study/results/probes > /dev/null ;;
    shortcuts)
      $PY -m probe.shortcuts checkpoints/*.pt --json --out study/results/shortcuts > /dev/null ;;
    figures)
      $PY study/scripts/figures.py --analyses ;;
    notebooks)
      (cd notebooks && for nb in *.ipynb; do
        echo "  $nb" >&2
        $PY -c 'import sys, nbformat; from nbclient import NotebookClient
nb = nbformat.read(sys.argv[1], as_version=4)
NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": "."}}).execute()
nbformat.write(nb, sys.argv[1])' "$nb"
      done) ;;
    *) echo "unknown step $step (gradients attributions probes shortcuts figures notebooks)" >&2; exit 2 ;;
  esac
done
# what a command regenerates stays out of study/results/, and the rest in compact form (compact_results.py)
$PY study/scripts/compact_results.py
