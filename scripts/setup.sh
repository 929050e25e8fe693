#!/usr/bin/env bash
# Creates .venv at the repository root and installs SpecDesk into it (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv" >&2
    "$PYTHON" -m venv .venv
fi
stamp=".venv/.specdesk-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ scripts/setup.sh -nt "$stamp" ]; then
    echo "setup: installing dependencies (llama-cpp-python compiles on first install: several minutes)" >&2
    .venv/bin/python -m pip install --quiet --upgrade pip
    # The PyTorch build is pinned so pip picks the CPU wheel where one is available.
    .venv/bin/python -m pip install --quiet "torch==2.13.0"
    .venv/bin/python -m pip install --quiet -e ".[torch,test]"
    touch "$stamp"
fi
