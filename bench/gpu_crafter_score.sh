#!/usr/bin/env bash
# One seed of the Crafter score with Moon et al.'s network (craftrl.configs.crafter_resnet) collected in lock-step,
# on a GPU machine with no package index, within one 10-minute command. The seed is drawn at run time.
#
# Here, first:  python bench/offline_wheels.py --out .whl --present bench/gpu_image_packages.txt
# There, from the repository root with .whl carried:  OUT=<folder> bash bench/gpu_crafter_score.sh
# Back here, the seeds of several such runs score together (each run folder holds episodes.jsonl and metrics.jsonl):
#   python bench/crafter_score.py --config craftrl.configs.crafter_resnet --runs <run folders> --seeds <their seeds> \
#       --ran-on '<the GPU machine, as score.log names it>' --write-results --results-file crafter_resnet_lockstep.md
#
# 64 envs each cut one 64-step fragment per policy version: 4096 steps per iteration, as Moon et al. collect, and
# 32 frames per inference call (bench/notes/crafter_score.md, "Their network in lock-step"). MINUTES bounds the
# training (default 8, so that the command, stop and copies included, ends inside 10 minutes); WHEELS is the
# folder of wheels (default .whl; none: use what is installed); arguments go to bench/crafter_score.py.
set -euo pipefail
: "${OUT:?OUT: the folder to copy the run files to}"
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl}
if [ -d "$WHEELS" ]; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site "$WHEELS"/*.whl
    export PYTHONPATH=/tmp/site:$PWD
fi
export RAY_USAGE_STATS_ENABLED=0 PYTHONUNBUFFERED=1
"$PYTHON" bench/crafter_score.py --config craftrl.configs.crafter_resnet --num-seeds 1 \
    --max-minutes "${MINUTES:-8}" --output-root /tmp/gpu_crafter_score "$@" \
    rollout_config.synchronous_sampling=true rollout_config.fragment_length=64 train_config.context_length=64 \
    train_config.batch_size_per_gpu=8 rollout_config.worker_config.num_envs=64 \
    rollout_config.worker_config.batch_size=32 2>&1 | tee "$OUT/score.log" || status=$?
# what the run left, even when scoring failed: at most 8 files come back, two folders deep
cp /tmp/gpu_crafter_score/seed*.log "$OUT/" 2>/dev/null || true
for run in /tmp/gpu_crafter_score/crafter-resnet-*/; do
    [ -d "$run" ] || continue
    mkdir -p "$OUT/$(basename "$run")"
    cp "$run"/episodes.jsonl "$run"/metrics.jsonl "$run"/config.yaml "$OUT/$(basename "$run")/" 2>/dev/null || true
done
exit "${status:-0}"
