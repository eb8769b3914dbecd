#!/usr/bin/env bash
# The GPU measurements in one call of at most 9 minutes (the device tool's timeout_s 600), in
# order of what decides most, each benchmark's results written as it ends:
#   0. finetune_memory (issue 60): peak memory and tokens/s of GPT-2's four sizes, full,
#      checkpointed and LoRA training, against train-gpt's memory estimate; a process per case,
#      each row written as it ends. About 20 s a case, at most 240 s.
#   1. gpu_variants: the fused loss's kernel against F.cross_entropy on one chunk of GPT-2's
#      logits, then each variant A/B against the default in one process at 64 x 1, 41
#      iterations each: --fused_loss, and Inductor's max-autotune-no-cudagraphs (bench-only; its
#      compile takes minutes, so it runs last and the step's limit may cut it). At most 240 s.
#   2. vs_nanogpt at 64 x 1: nanoGPT, ours default and ours with GPT-2's choices, ours with
#      the train-gpt flags that won in 1 by at least 1% (BENCH_OURS_FLAGS). Three of the six
#      cases: all six took 390 s on an H200 at 15e2df4, more than is left after 1. About 190 s.
#   3. precision --quick: float32, bf16 chunked and bf16 fused loss, 50 iterations each (about
#      150 s: three took 147 s at 15e2df4).
# A step starts only if its usual time fits in what is left of GPU_SESSION_BUDGET_S (540 s),
# and stops at its limit, so the call ends within the budget with what finished; a step left
# out says so, and how to run it in a call of its own.
#
# Here, beside ../shared, first (the GPU machine gets the checkout alone):
#   bash bench/gpu_session.sh prepare
# then on the GPU machine, in the checkout (the device tool: carry [".gpu-shared"]):
#   bash bench/gpu_session.sh                 # the three steps above
#   bash bench/gpu_session.sh vs_nanogpt      # or named benchmarks alone, whole: here the six
#                                             # cases (with 1's winners if its results are there)
# Results: $OUT/gpu-results/ (the device tool brings $OUT back), else bench/results/gpu/.
# Copy them into ../shared/gpu-results/<date>-<gpu>/, then fill bench/speed_trials.md.
set -euo pipefail
cd "$(dirname "$0")/.."

if [[ "${1:-}" == "prepare" ]]; then
    mkdir -p .gpu-shared/peers .gpu-shared/data
    cp -r ../shared/peers/nanogpt .gpu-shared/peers/
    cp ../shared/data/shakespeare_plays.txt .gpu-shared/data/
    echo "gpu_session: .gpu-shared/ holds nanoGPT and the plays; carry it to the GPU machine"
    exit 0
fi

python="${PYTHON:-python}"  # the GPU machine's own Python: torch with CUDA, tiktoken, numpy
"$python" -c 'import sys, torch
if not torch.cuda.is_available():
    sys.exit("gpu_session: no CUDA device here; run it on a GPU machine")
print("gpu_session:", torch.cuda.get_device_name(), "torch", torch.__version__)'
results="${OUT:+$OUT/gpu-results}"
results="${results:-bench/results/gpu}"
mkdir -p "$results"
export GPT_SHARED="${GPT_SHARED:-.gpu-shared}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
budget="${GPU_SESSION_BUDGET_S:-540}"
failed=()

say() { echo "gpu_session: $*" | tee -a "$results/session.log"; }

# step NEED LIMIT [NAME=VALUE ...] -- BENCHMARK [FLAGS]: `python -m bench` of one benchmark, if
# NEED seconds are left of the budget, stopped after LIMIT seconds (or what is left).
step() {
    local need=$1 limit=$2 settings=() left status
    shift 2
    while [[ "$1" != "--" ]]; do settings+=("$1"); shift; done
    shift
    left=$((budget - SECONDS))
    if ((left < need)); then
        say "$* left out: it takes about $need s, $left s of the budget are left;" \
            "run it in a call of its own: bash bench/gpu_session.sh $1"
        return 0
    fi
    ((limit <= left)) || limit=$left
    # At least a second: `timeout 0` is no limit at all, and bash's SECONDS counts whole seconds
    # from the wall clock's, so a budget of 1 s can be all spent a moment after the start.
    ((limit >= 1)) || limit=1
    say "$* (at most $limit s) ..."
    status=0
    env ${settings[@]+"${settings[@]}"} timeout --kill-after=15 "$limit" \
        "$python" -m bench --results "$results" "$@" 2>&1 | tee -a "$results/session.log" \
        || status=$?
    if ((status == 124 || status == 137)); then
        say "$* stopped at its limit of $limit s; what it printed is in session.log"
    fi
    ((status == 0)) || failed+=("$*")  # the others still run
}

# The train-gpt flags of the variants that won (none before gpu_variants has run).
winners() {
    "$python" -m bench.gpu_variants winners "$results/gpu_variants.json" 2>/dev/null || echo '{}'
}

if (($#)); then
    for name in "$@"; do
        if [[ "$name" == vs_nanogpt ]]; then
            step 0 "$budget" "BENCH_OURS_FLAGS=$(winners)" -- vs_nanogpt
        else
            step 0 "$budget" -- "$name"
        fi
    done
else
    step 60 240 -- finetune_memory
    step 120 240 -- gpu_variants
    step 170 230 BENCH_SPLITS=64 "BENCH_OURS_FLAGS=$(winners)" -- vs_nanogpt
    step 140 "$budget" -- precision --quick
fi
say "done in $SECONDS s; results in $results${failed[*]:+; failed: ${failed[*]}}"
[[ ${#failed[@]} -eq 0 ]]
