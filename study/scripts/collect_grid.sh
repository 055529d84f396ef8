#!/usr/bin/env bash
# Bring a grid's finished runs into study/results/NAME and everything that quotes them up to date, so that each
# finished run can be committed as it lands (a grid outlives a session only through what is committed):
#   1. the runs in compact form (python -m probe.results collect runs/NAME study/results/NAME), windows included;
#   2. the grid's own tables (python -m probe.sweep study/results/NAME --report --no-figure --in-place);
#   3. for the fresh grid, the pre-registered claims judged on it (probe.sweep --confirm study/claims.toml) and its
#      figure (study/scripts/figures.py --only fresh_by_window); for an ssm_ grid, each new run's SSM transitions and channel
#      fades (study/scripts/recurrent_transitions.py into study/results/NAME/transitions.csv; runs read are skipped);
#      for transfer and bridged, their claims (study/claims_NAME.toml), and for bridged each new run's "can this
#      recurrence count?" reading (study/scripts/bridged_transitions.py into study/results/bridged/transitions.csv);
#      for coadaptation2, the placebo's per-step cap log summarised per run (study/scripts/placebo_cap.py into
#      study/results/NAME/placebo_cap.csv; collect keeps those lines out of training.csv);
#   4. every rendered table of README.md, docs/ and study/docs/ (study/scripts/render_docs.py);
#   5. the size budget of study/results/ (study/tests/test_results_size.py) and the reachable-p rule.
# It reads the run folders only: a sweep still training in runs/NAME goes on undisturbed. Nothing is committed.
# Usage: study/scripts/collect_grid.sh NAME [RUNS_DIR]   (RUNS_DIR default runs/NAME)
set -euo pipefail
cd "$(dirname "$0")/../.."  # the repository root
PY=${PYTHON:-$PWD/.venv/bin/python}
export MPLBACKEND=Agg MPLCONFIGDIR=${MPLCONFIGDIR:-$(mktemp -d)}
name=${1:?usage: study/scripts/collect_grid.sh NAME [RUNS_DIR]}
runs=${2:-runs/$name}
out=study/results/$name
[ -d "$runs" ] || { echo "$runs: no such run folder (give RUNS_DIR)" >&2; exit 2; }

$PY -m probe.results collect "$runs" "$out" --no-progress
$PY -m probe.sweep "$out" --report --no-figure --in-place >/dev/null
if [ "$name" = fresh ]; then
  # relative paths: claims.md names the grid as the docs link it
  $PY -m probe.sweep --confirm study/claims.toml --out "$out" --no-train >/dev/null
  $PY study/scripts/figures.py --only fresh_by_window --quiet
fi
if [ "$name" = transfer ] || [ "$name" = bridged ]; then
  # the second task's and the bridged cells' pre-registered claims (issue 51), judged on what has landed so far
  $PY -m probe.sweep --confirm "study/claims_$name.toml" --out "$out" --no-train >/dev/null
fi
if [ "$name" = bridged ]; then
  $PY study/scripts/bridged_transitions.py "$runs" --out "$out/transitions.csv"
fi
if [ "$name" = coadaptation2 ]; then
  $PY study/scripts/placebo_cap.py "$runs" "$out"
fi
case $name in
  ssm_*) $PY study/scripts/recurrent_transitions.py "$runs" --out "$out/transitions.csv" ;;
esac
rm -f "$out/results.json" "$out/claims.json"  # the tables are committed as results.md and claims.md
$PY study/scripts/render_docs.py
$PY -m pytest -q -p no:cacheprovider study/tests/test_results_size.py study/tests/test_reachable_p.py \
  study/tests/test_docs.py
git status --short -- "$out" figures README.md docs study/docs study/README.md
