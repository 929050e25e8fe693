#!/usr/bin/env bash
# Sets everything up, installs the demo model family if missing, and runs SpecDesk on it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/specdesk demo build > /dev/null
exec .venv/bin/specdesk compare --method draft "$@"
