#!/usr/bin/env bash
# The PyTorch engine's tests and benchmark on a CUDA (or ROCm) GPU, and the llama.cpp engine
# with every layer on the GPU, in under 8 minutes once the CUDA build of llama-cpp-python is cached.
#
#   benchmarks/device_cuda.sh [--dry-run] [OUT_DIR]
#
# --dry-run runs every llama.cpp step on the CPU with the small zoo and the torch benchmark on
# the CPU, skipping what needs a GPU (tests/test_device_scripts.py runs it, so it cannot rot).
#
# llama.cpp (benchmarks/device_llama.py): a CUDA build of llama-cpp-python (GGML_CUDA and
# GGML_RPC), built once into ~/.cache/specdesk/llama-wheels/ from .whl/llama_cpp_python-*.tar.gz
# when present (a machine without network access), else from PyPI; the zoo's Llama-3-8B-shaped
# target at Q4_K_M with its draft, fully offloaded: none, draft, ngram and auto tok/s, t(k)/t(1),
# decode against the card's memory bandwidth; llama-server (CUDA, built once) on the same files.
#
# Needs python3 with torch (GPU build), safetensors, tokenizers, numpy, scipy, jinja2, pytest;
# platformdirs and gguf are installed from wheels in .whl/ when present (a machine without
# network access), else from PyPI. llama-cpp-python is optional: without it the two
# cross-engine tests skip. Prints JSON lines; writes pytest's log and the benchmark's JSON
# into OUT_DIR (default: $OUT, else ./device-out).
set -euo pipefail
cd "$(dirname "$0")/.."
dry_run=0
if [ "${1:-}" = "--dry-run" ]; then
    dry_run=1
    shift
fi
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
llama_part() {
    # The llama.cpp engine fully offloaded (dry run: on the CPU, small zoo). Prints JSON lines.
    local version=0.3.36 cache="${SPECDESK_CACHE_DIR:-$HOME/.cache/specdesk}"
    local args=(--max-tokens 128 --prompts 3 --threads 8)
    if [ "$dry_run" = 1 ]; then
        echo '{"step": "llama_cuda_build", "skipped": "dry run: the installed llama-cpp-python, on the CPU"}'
        args=(--dry-run --max-tokens 8 --prompts 1 --threads 1 --repeats 3)
        local cpu_server="$cache/llama-native/$version/build-server/bin/llama-server"
        [ -x "$cpu_server" ] && args+=(--server "$cpu_server")  # built by benchmarks/native_drivers.py
    else
        local wheels="$cache/llama-wheels/cuda-$version" sdist
        sdist=$(ls .whl/llama_cpp_python-"$version".tar.gz 2>/dev/null || echo "llama-cpp-python==$version")
        if ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
            local started=$SECONDS
            CMAKE_ARGS="-DGGML_CUDA=ON -DGGML_RPC=ON -DGGML_NATIVE=OFF -DCMAKE_CUDA_ARCHITECTURES=native" \
                CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) timeout 1500 python3 -m pip wheel -q --no-deps \
                --no-binary llama-cpp-python "$sdist" -w "$wheels.partial" && mv "$wheels.partial" "$wheels"
            echo "{\"step\": \"llama_cuda_build\", \"seconds\": $((SECONDS - started))}"
        fi
        python3 -m pip install -q --no-deps --upgrade --target "$site" "$wheels"/llama_cpp_python-*.whl
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
        local server="$cache/llama-native/$version/build-server-cuda/bin/llama-server"
        if [ ! -x "$server" ] && [ -d "$cache/llama-native/$version/src" ]; then
            cmake -S "$cache/llama-native/$version/src" -B "$cache/llama-native/$version/build-server-cuda" \
                -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native -DLLAMA_CURL=OFF \
                -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
                -DBUILD_SHARED_LIBS=OFF >/dev/null && \
                timeout 600 cmake --build "$cache/llama-native/$version/build-server-cuda" -j "$(nproc)" \
                --target llama-server >/dev/null || true
        fi
        [ -x "$server" ] && args+=(--server "$server")
    fi
    timeout 420 python3 -m benchmarks.device_llama "${args[@]}" | tee "$out/llama.jsonl"
}

if [ "$dry_run" = 1 ]; then
    export SPECDESK_CACHE_DIR="${SPECDESK_CACHE_DIR:-$HOME/.cache/specdesk}"
    llama_part
    if python3 -c "import torch" 2>/dev/null; then
        timeout 120 python3 benchmarks/torch_engine.py --device cpu --dtype float32 --k 4 --prompts 1 \
            --max-tokens 8 --methods draft | tee "$out/bench-float32.jsonl"
    else
        echo '{"step": "torch", "skipped": "torch is not installed here"}'
    fi
    exit 0
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
# The llama.cpp engine with every layer on the GPU (a failure here leaves the rest standing).
llama_part || echo '{"step": "llama", "error": "the llama.cpp part failed: see the lines above"}'
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
