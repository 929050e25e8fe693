#!/usr/bin/env bash
# Builds the macOS installers of one flavour and self-tests the app:
#   dist/<flavour>/SpecDesk.app                              the application bundle
#   dist/SpecDesk-<version>-macos-<arch>-<flavour>.dmg        a disk image: the app and a link to /Applications
#
#   bash packaging/macos/build_macos.sh [--flavour gguf|full] [--no-dmg] [--no-selftest]
#
# Needs the packaging extra (pip install -e '.[packaging]', plus '.[torch]' for full) and the
# Xcode command line tools (codesign, hdiutil ship with macOS). The app is signed ad hoc,
# which runs on the machine that downloads it after the usual Gatekeeper confirmation;
# set CODESIGN_IDENTITY to sign with a Developer ID instead (notarisation is not scripted).
# PYTHON overrides the interpreter (default: .venv/bin/python).
#
# Backend: Metal on Apple silicon (scripts/llama_backend.py chooses it on macOS arm64, and
# llama-cpp-python turns it on there), as the interpreter's llama-cpp-python was built; the
# self-test prints the backend the bundle carries.
set -euo pipefail
cd "$(dirname "$0")/../.."

flavour=gguf
dmg=1
selftest=1
while [ $# -gt 0 ]; do
    case "$1" in
        --flavour) flavour="$2"; shift 2 ;;
        --no-dmg) dmg=0; shift ;;
        --no-selftest) selftest=0; shift ;;
        *) echo "build_macos: unknown option $1" >&2; exit 2 ;;
    esac
done
case "$flavour" in gguf|full) ;; *) echo "build_macos: --flavour is gguf or full, not $flavour" >&2; exit 2 ;; esac

PYTHON="${PYTHON:-.venv/bin/python}"
version="$("$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
arch="$(uname -m)"
app="dist/$flavour/SpecDesk.app"
started=$(date +%s)

echo "build_macos: building the $flavour bundle with PyInstaller" >&2
"$PYTHON" -m PyInstaller --noconfirm --clean --log-level WARN \
    --workpath "build/pyinstaller-$flavour" --distpath "dist/$flavour" \
    packaging/specdesk.spec -- --flavour "$flavour"

if [ "$flavour" = gguf ] && [ -n "$(find "$app" -maxdepth 4 -type d -name torch -print -quit)" ]; then
    echo "build_macos: torch is in the GGUF-only bundle" >&2
    exit 1
fi
# Folders of the build machine compiled into libraries: rewrite them, re-sign what changed
# (a modified Mach-O file loses its signature, and arm64 refuses unsigned code), then prove
# none is left.
"$PYTHON" packaging/bundle_paths.py scrub "$app"
codesign --force --deep --sign "${CODESIGN_IDENTITY:--}" "$app"
"$PYTHON" packaging/bundle_paths.py check "$app"

size_kb=$(du -sk "$app" | cut -f1)
echo "build_macos: $app is $((size_kb * 1024 / 1000 / 1000)) MB unpacked" >&2

if [ "$selftest" = 1 ]; then
    (cd / && env -u VIRTUAL_ENV -u PYTHONPATH -u PYTHONHOME OMP_NUM_THREADS=1 \
        "$OLDPWD/$app/Contents/MacOS/specdesk" --selftest)
fi

if [ "$dmg" = 1 ]; then
    stage="build/dmg-$flavour"
    rm -rf "$stage" && mkdir -p "$stage"
    cp -R "$app" "$stage/"
    ln -s /Applications "$stage/Applications"
    image="dist/SpecDesk-$version-macos-$arch-$flavour.dmg"
    rm -f "$image"
    hdiutil create -volname "SpecDesk" -srcfolder "$stage" -fs HFS+ -format UDZO -ov "$image" >/dev/null
    echo "build_macos: $image ($(du -h "$image" | cut -f1))" >&2
fi
echo "build_macos: done in $(( $(date +%s) - started )) s" >&2
