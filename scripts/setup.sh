#!/usr/bin/env bash
# Creates .venv at the repository root and installs SpecDesk into it (idempotent).
#
#   scripts/setup.sh                   set up (or bring up to date) .venv
#   scripts/setup.sh --print-backend   print the llama.cpp backend set-up would build, and why
#
# llama-cpp-python is compiled here for one llama.cpp backend, chosen from what the machine
# has (scripts/llama_backend.py: Metal, CUDA, HIP, Vulkan or the CPU; SPECDESK_LLAMA_BACKEND
# overrides it), with portable CPU code and the RPC backend. The wheel is built first, into
# a cache keyed by those flags, and only a wheel that built is installed: a GPU build that
# fails falls back to the CPU build, and .venv is never left half-installed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
LLAMA_VERSION="$("$PYTHON" -c 'import sys; sys.path.insert(0, "scripts"); import llama_backend; print(llama_backend.LLAMA_CPP_PYTHON)')"
# The virtual environment; tests of set-up point it elsewhere.
VENV="${SPECDESK_VENV:-.venv}"

choice="$("$PYTHON" scripts/llama_backend.py choose)"
backend="${choice%%$'\t'*}"
reason="${choice#*$'\t'}"
if [ "${1:-}" = "--print-backend" ]; then
    baseline="$("$PYTHON" scripts/llama_backend.py cpu-baseline)"
    echo "llama.cpp backend: $backend ($reason); CPU code: ${baseline%%$'\t'*} (${baseline#*$'\t'})"
    exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
    echo "setup: creating $VENV" >&2
    "$PYTHON" -m venv "$VENV"
fi

# llama-cpp-python's source distribution with packaging/llama-patches/*.patch applied to its
# vendored llama.cpp (in name order), built into a wheel in folder $2 with CMake arguments $1.
patched_wheel() {
    local args="$1" out="$2" src patch_file root
    root="$(pwd)"
    # (called as an `if` condition, where `set -e` does not apply: each step returns its failure)
    "$VENV/bin/python" -m pip download --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_VERSION" \
        -d "$out/sdist" || return 1
    tar xzf "$out/sdist/llama_cpp_python-$LLAMA_VERSION.tar.gz" -C "$out/sdist" || return 1
    src="$out/sdist/llama_cpp_python-$LLAMA_VERSION"
    for patch_file in packaging/llama-patches/*.patch; do
        [ -e "$patch_file" ] || continue
        echo "applying $patch_file"
        if command -v patch >/dev/null 2>&1; then
            patch -p1 --batch --forward -d "$src/vendor/llama.cpp" < "$patch_file" || return 1
        else  # git applies a patch outside a repository as patch(1) does
            (cd "$src/vendor/llama.cpp" && git apply -p1 "$root/$patch_file") || return 1
        fi
    done
    CMAKE_ARGS="$args" "$VENV/bin/python" -m pip wheel --no-deps --no-cache-dir "$src" -w "$out" || return 1
    rm -rf "$out/sdist"
}

# The llama-cpp-python wheel for a backend: built once per backend, CPU baseline and Python,
# kept under the user's cache, so a new checkout or a rebuilt .venv does not compile again.
llama_wheel() {
    local backend="$1" args dir log
    args="$("$PYTHON" scripts/llama_backend.py cmake-args "$backend")"
    dir="$("$PYTHON" scripts/llama_backend.py wheel-dir "$backend" "$VENV/bin/python")"
    if [ -f "$dir.failed/build.log" ]; then
        echo "setup: the $backend build of llama-cpp-python failed before (its log: $dir.failed/build.log; delete that folder to try again)" >&2
        return 1
    fi
    if ! ls "$dir"/llama_cpp_python-*.whl >/dev/null 2>&1; then
        echo "setup: compiling llama-cpp-python $LLAMA_VERSION for $backend (several minutes, once): $args" >&2
        rm -rf "$dir.partial" && mkdir -p "$dir.partial"
        log="$dir.partial/build.log"
        if ! patched_wheel "$args" "$dir.partial" >"$log" 2>&1; then
            rm -rf "$dir.failed" && mv "$dir.partial" "$dir.failed"
            echo "setup: the $backend build of llama-cpp-python failed; its log: $dir.failed/build.log" >&2
            return 1
        fi
        rm -f "$log"
        rm -rf "$dir" && mv "$dir.partial" "$dir"
    fi
    ls "$dir"/llama_cpp_python-*.whl
}

stamp="$VENV/.specdesk-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ scripts/setup.sh -nt "$stamp" ] \
        || [ scripts/llama_backend.py -nt "$stamp" ] || [ "$(cut -d' ' -f1 "$stamp")" != "$backend" ] \
        || [ -n "$(find packaging/llama-patches -newer "$stamp" -name '*.patch' 2>/dev/null)" ]; then
    echo "setup: llama.cpp backend $backend ($reason)" >&2
    echo "setup: installing dependencies" >&2
    rm -f "$stamp"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    requested="$backend"
    if ! wheel="$(llama_wheel "$backend")"; then
        if [ "$backend" = cpu ]; then
            exit 1
        fi
        echo "setup: falling back to the CPU build of llama.cpp (the $backend build failed, see above)" >&2
        backend=cpu
        wheel="$(llama_wheel cpu)"
    fi
    "$VENV/bin/python" -m pip install --quiet --force-reinstall --no-deps "$wheel"
    # llama-cpp-python's own dependencies, from its wheel's metadata.
    "$VENV/bin/python" -m pip install --quiet "$wheel"
    echo "$requested $backend" > "$VENV/.specdesk-llama"
    if [ -n "${SPECDESK_SETUP_LLAMA_ONLY:-}" ]; then  # set-up's own tests stop here
        exit 0
    fi
    # The PyTorch build is pinned so pip picks the CPU wheel where one is available.
    "$VENV/bin/python" -m pip install --quiet "torch==2.13.0"
    "$VENV/bin/python" -m pip install --quiet -e ".[torch,test]"
    echo "$requested $backend" > "$stamp"
fi
