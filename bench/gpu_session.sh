#!/usr/bin/env bash
# The GPU measurements of issue 35 (speed and memory at GPT-2 124M against nanoGPT) in one
# call to a GPU machine, in order of what matters most, each benchmark's results written as it
# ends (so a call cut short keeps what finished):
#   1. vs_nanogpt: the six cases of the issue's table (304 s on an H200 at 3d8943e);
#   2. precision: float32, bfloat16 with the whole logits and with the chunked loss, 50 steps
#      each (two runs took 111 s; three: about 165 s);
#   3. step_memory --quick: one step's peak memory, nanoGPT, ours whole and chunked, eager, at
#      16 x 1024 (about 40 s).
# About 8.5 minutes in all: give the call timeout_s 600.
#
# Here, beside ../shared, first (the GPU machine gets the checkout alone):
#   bash bench/gpu_session.sh prepare
# then on the GPU machine, in the checkout (the device tool: carry [".gpu-shared"]):
#   bash bench/gpu_session.sh
# Results: $OUT/gpu-results/ (the device tool brings $OUT back), else bench/results/gpu/.
# Copy them into bench/results/, then fill the H100/H200 column of bench/speed_trials.md.
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
failed=()
for bench in vs_nanogpt precision "step_memory --quick"; do
    # shellcheck disable=SC2086  # "step_memory --quick" is a name and its flag
    "$python" -m bench --results "$results" $bench 2>&1 | tee -a "$results/session.log" \
        || failed+=("$bench")  # the others still run
done
echo "gpu_session: done; results in $results${failed:+; failed: ${failed[*]}}"
[[ ${#failed[@]} -eq 0 ]]
