#!/usr/bin/env bash
# The test command: sets up .venv if needed, then runs the whole suite. With no arguments it
# also builds and self-tests the Linux bundle when packaging/ or the dependencies changed
# (scripts/bundle_check.sh; silent and instant otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export QT_QPA_PLATFORM=offscreen
if [ $# -eq 0 ]; then
    bash scripts/bundle_check.sh
fi
# One worker per CPU (pytest-xdist), each taking whole files: most tests run one thread, so a
# single worker leaves the other cores idle. Build caches the files share are locked
# (app/storage/paths.building).
exec .venv/bin/python -m pytest -q -n "${SPECDESK_TEST_WORKERS:-auto}" --dist loadfile --durations=25 "$@"
