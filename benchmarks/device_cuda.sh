#!/usr/bin/env bash
# The PyTorch engine's tests and benchmark on a CUDA (or ROCm) GPU, in under 8 minutes.
#
#   benchmarks/device_cuda.sh [OUT_DIR]
#
# Needs python3 with torch (GPU build), safetensors, tokenizers, numpy, scipy, jinja2, pytest;
# platformdirs and gguf are installed from wheels in .whl/ when present (a machine without
# network access), else from PyPI. llama-cpp-python is optional: without it the two
# cross-engine tests skip. Prints JSON lines; writes pytest's log and the benchmark's JSON
# into OUT_DIR (default: $OUT, else ./device-out).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-device-out}}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1 QT_QPA_PLATFORM=offscreen

site=/tmp/specdesk-site
if ! python3 -c "import specdesk.engines.torch.engine" 2>/dev/null; then
    if ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl
    else
        python3 -m pip install -q --no-deps --target "$site" platformdirs gguf
    fi
    python3 -m pip install -q --no-deps --no-build-isolation --no-compile --target "$site" .
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
python3 - <<'PY'
import json, torch
assert torch.cuda.is_available(), "no CUDA/ROCm device visible to torch"
print(json.dumps({"torch": torch.__version__, "device": torch.cuda.get_device_name(0),
                  "hip": getattr(torch.version, "hip", None)}))
PY

# The small family trains in about a minute on a GPU machine's CPU cores; cached under .pytest_cache.
export SPECDESK_TORCH_TEST_DEVICE=cuda
set +e
timeout 270 python3 -m pytest -q \
    tests/test_torch_verify.py tests/test_torch_engine.py tests/test_torch_loader.py \
    tests/test_torch_demo_drafters.py 2>&1 | tee "$out/pytest.log"
tests_status=${PIPESTATUS[0]}
set -e

# The demo family (derived from assets/demo in seconds), bf16 and float32 on the GPU.
export SPECDESK_CACHE_DIR=/tmp/specdesk-cache
for dtype in bfloat16 float32; do
    timeout 90 python3 benchmarks/torch_engine.py --device cuda --dtype "$dtype" --k 4 --prompts 6 \
        --max-tokens 128 | tee "$out/bench-$dtype.jsonl"
done
# Served engines against a real vLLM, when this machine has it and a local model to serve
# (the machine reaches no network): SPECDESK_VLLM_MODEL=/path/to/model, and optionally
# SPECDESK_VLLM_SPEC='{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}'.
# A baseline and a speculative server side by side; benchmarks/served.py compares them.
if python3 -c "import vllm" 2>/dev/null && [ -n "${SPECDESK_VLLM_MODEL:-}" ]; then
    default_spec='{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}'
    spec_config="${SPECDESK_VLLM_SPEC:-$default_spec}"
    vllm serve "$SPECDESK_VLLM_MODEL" --port 8101 --gpu-memory-utilization 0.4 --max-model-len 4096 \
        --speculative-config "$spec_config" --per-request-spec-decode-metrics summary >"$out/vllm-spec.log" 2>&1 &
    spec_pid=$!
    vllm serve "$SPECDESK_VLLM_MODEL" --port 8102 --gpu-memory-utilization 0.4 --max-model-len 4096 \
        >"$out/vllm-base.log" 2>&1 &
    base_pid=$!
    for _ in $(seq 120); do
        curl -sf localhost:8101/health >/dev/null && curl -sf localhost:8102/health >/dev/null && break
        sleep 2
    done
    timeout 240 python3 benchmarks/served.py --endpoint http://localhost:8101 \
        --baseline-endpoint http://localhost:8102 --prompts 4 --max-tokens 128 | tee "$out/served-vllm.jsonl" || true
    kill "$spec_pid" "$base_pid" 2>/dev/null || true
    wait "$spec_pid" "$base_pid" 2>/dev/null || true
else
    echo '{"served_vllm": "skipped: vllm is not installed here, or SPECDESK_VLLM_MODEL names no local model"}'
fi
exit "$tests_status"
