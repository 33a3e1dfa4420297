#!/usr/bin/env bash
# kitae's compiled loop on one NVIDIA GPU, with the JAX, Flax, Optax and Orbax of the machine's
# own image (the lent machine cannot reach the package index; the few packages its image lacks
# travel as wheels in .whl/, see BENCHMARKS.md "On a GPU"). Run from the repository root:
#
#     bash benchmarks/gpu_check.sh [train] [recurrent] [rejax] [tests]   # default: all four
#
# Results go under $OUT (default /tmp/gpu_check) and nowhere else: versions.txt, train.txt,
# recurrent.txt, recurrent.json (bench_recurrent.py's, through KITAE_BENCH_RESULTS), rejax.txt,
# compare_rejax.json (compare_rejax.py's --out) and tests.txt; benchmarks/results/ is left as it is.
#
# 1. one seed of PPO on gymnax CartPole-v1 (the preset, 500k steps), twice: the return, the
#    compile and train seconds, and whether the two runs end with the same bits on the GPU;
# 2. the same with 16 seeds in one program;
# 3. the recurrent speed case of issue 12 (ppo_lstm against ppo, compiled loop, 51,200 steps);
# 4. kitae against rejax, one seed and 16 seeds, whole processes, cold caches;
# 5. the maths tests (returns, advantages, distributions) on the GPU.
set -u
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1
{
    nvidia-smi -L
    python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"
} 2>&1 | tee "$OUT/versions.txt"

parts=${*:-train recurrent rejax tests}
has() { [[ " $parts " == *" $1 "* ]]; }
# A whole `kitae` process with an empty compilation cache, timed.
kitae() { KITAE_CACHE_DIR=$(mktemp -d) /usr/bin/time -f "whole process %e s" python3 -m kitae.cli "$@"; }
has train && {
    for round in 1 2; do
        echo "== one seed, round $round"
        kitae train ppo gymnax:CartPole-v1 --seed 0 --quiet \
            --run-dir "/tmp/gpu_one_$round"
    done
    echo "== 16 seeds"
    kitae train ppo gymnax:CartPole-v1 --seeds 16 --quiet \
        --run-dir /tmp/gpu_seeds
    for f in /tmp/gpu_one_1 /tmp/gpu_one_2 /tmp/gpu_seeds; do
        python3 -c "import json,sys; s=json.load(open(sys.argv[1]+'/summary.json')); print(sys.argv[1], {k: s.get(k) for k in ('final_return','compile_seconds','train_seconds','state_fingerprint')})" "$f"
    done
} 2>&1 | tee "$OUT/train.txt"

has recurrent && KITAE_BENCH_RESULTS="$OUT" timeout 200 python3 benchmarks/bench_recurrent.py --only speed \
    --repeats 2 --speed-steps 51200 2>&1 | tee "$OUT/recurrent.txt"

has rejax && timeout 240 python3 benchmarks/compare_rejax.py one --rounds 2 --out "$OUT/compare_rejax.json" \
    2>&1 | tee "$OUT/rejax.txt"
has rejax && timeout 150 python3 benchmarks/compare_rejax.py seeds --rounds 1 --out "$OUT/compare_rejax.json" \
    2>&1 | tee -a "$OUT/rejax.txt"

has tests && timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_timesteps.py \
    tests/test_distributions.py 2>&1 | tail -15 | tee "$OUT/tests.txt"
