#!/usr/bin/env bash
# Sets everything up, installs the demo model family if missing, and opens SpecDesk on it
# (with no display: runs `specdesk compare` on the demo pair in the terminal).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/specdesk demo build > /dev/null
exec .venv/bin/specdesk "$@"
