#!/usr/bin/env bash
# One short, prepared check of probe on a CUDA machine (issues 31, 33): the CUDA tests, every analysis CLI on the
# shipped checkpoints with --device cuda (exit code and wall time of each, beside the same command on the CPU), and
# one round of the fresh-seed grid on the GPU (seeds 10 and 11 of study/sweeps/fresh.toml, bf16 and fp32, 16 runs),
# collected in compact form so that it pairs by seed with the CPU's runs in study/results/fresh.
#
# Usage, from the repository's root on the GPU machine: OUT=/some/dir bash benchmarks/device_check.sh [--no-grid]
# The machine has no package registry: wheels the image lacks (transformer-lens and the few it needs beyond the
# image: datasets, dill, multiprocess) go in .wheels/ (ignored by git), made here with
#   pip download transformer-lens datasets dill multiprocess --no-deps -d .wheels
# Everything it writes is under $OUT, as at most 8 files: cuda_tests.txt, cli_cuda.tsv, cli_log.txt, grid.txt,
# fresh_cuda.tar.gz, env.txt.
set -u
OUT=${OUT:-runs/device_check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
export MPLBACKEND=Agg MPLCONFIGDIR=$(mktemp -d) PYTHONDONTWRITEBYTECODE=1

{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; $PY -c "import torch, sys;
print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name(0))"; } > "$OUT/env.txt" 2>&1
if ! $PY -c "import transformer_lens" 2>/dev/null && ls .wheels/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-deps --no-index .wheels/*.whl >> "$OUT/env.txt" 2>&1
fi
$PY -m pip install -q --no-deps --no-build-isolation -e . >> "$OUT/env.txt" 2>&1
$PY -c "import probe, transformer_lens, captum, sklearn, seaborn, tqdm" >> "$OUT/env.txt" 2>&1 \
    || echo "missing a dependency: see above" >> "$OUT/env.txt"

# the tests that need CUDA (skipped on a CPU), and the trainer's and analyses' own tests on this machine's CPU
timeout 240 $PY -m pytest -q -x -p no:cacheprovider -k "cuda" tests > "$OUT/cuda_tests.txt" 2>&1

# every analysis CLI on a shipped checkpoint, on the GPU and on the CPU, one after the other
CKPT=checkpoints/hybrid-joint.pt
printf "command\tdevice\trc\twall_s\n" > "$OUT/cli_cuda.tsv"
for cmd in "evaluate $CKPT --lengths 1:400" "gradients $CKPT" "attributions $CKPT" "probes checkpoints/hybrid-dat.pt" \
           "shortcuts $CKPT" "sharpness checkpoints/hybrid-dat.pt"; do
    for dev in cuda cpu; do
        start=$(date +%s%N)
        # shellcheck disable=SC2086
        timeout 120 $PY -m probe.$cmd --device $dev --json --no-progress --out "$OUT/tmp_$dev" \
            > /dev/null 2>> "$OUT/cli_log.txt"
        rc=$?
        ms=$(( ($(date +%s%N) - start) / 1000000 ))
        printf "%s\t%s\t%s\t%d.%03d\n" "$cmd" "$dev" "$rc" $((ms / 1000)) $((ms % 1000)) >> "$OUT/cli_cuda.tsv"
    done
done
rm -rf "$OUT/tmp_cuda" "$OUT/tmp_cpu"

# one round of the fresh-seed grid on the GPU: 16 runs at once
if [ "${1:-}" != "--no-grid" ]; then
    timeout 420 $PY -m probe.sweep study/sweeps/fresh.toml --seeds 10 11 --device cuda --jobs 16 --no-progress \
        --out runs/fresh_cuda > "$OUT/grid.txt" 2>&1
    $PY -m probe.results collect runs/fresh_cuda runs/fresh_cuda_compact >> "$OUT/grid.txt" 2>&1
    tar -czf "$OUT/fresh_cuda.tar.gz" -C runs fresh_cuda_compact
fi
cat "$OUT/cli_cuda.tsv"
