#!/usr/bin/env bash
# Builds the Linux installers of one flavour and self-tests the bundle:
#   dist/<flavour>/specdesk/                                the one-folder bundle
#   dist/specdesk-<version>-linux-<arch>-<flavour>.tar.gz   bundle + .desktop file + icon
#   dist/SpecDesk-<version>-<arch>-<flavour>.AppImage        when appimagetool is on PATH
#
#   bash packaging/build_linux.sh [--flavour gguf|full] [--no-archive] [--no-selftest]
#
# gguf (default): llama.cpp engine, no PyTorch. full: adds PyTorch (CPU), for training the
# demo family and HF checkpoints. Needs the packaging extra: pip install -e '.[packaging]'
# (and '.[torch]' for full). PYTHON overrides the interpreter (default: .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."

flavour=gguf
archive=1
selftest=1
while [ $# -gt 0 ]; do
    case "$1" in
        --flavour) flavour="$2"; shift 2 ;;
        --no-archive) archive=0; shift ;;
        --no-selftest) selftest=0; shift ;;
        *) echo "build_linux: unknown option $1" >&2; exit 2 ;;
    esac
done
case "$flavour" in gguf|full) ;; *) echo "build_linux: --flavour is gguf or full, not $flavour" >&2; exit 2 ;; esac

PYTHON="${PYTHON:-.venv/bin/python}"
# The GGUF-only bundle must stay under 272 MB unpacked: 250 MB, plus 15 MB for llama.cpp's CPU
# code as fourteen run-time variants (19 MB, where one fixed level took 1.3 MB; libllama ships once),
# plus 5 MB for the demo's DSpark drafter (6.2 MB, its Markov head 4 MB of it), plus 2 MB for the
# patched CPU kernels (packaging/llama-patches: the fourteen variants 19.2 -> 20.2 MB).
GGUF_LIMIT_BYTES=$((272 * 1000 * 1000))
version="$("$PYTHON" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')"
arch="$(uname -m)"
bundle="dist/$flavour/specdesk"

if ! "$PYTHON" -c 'import PyInstaller' 2>/dev/null; then
    echo "build_linux: PyInstaller is missing: $PYTHON -m pip install -e '.[packaging]'" >&2
    exit 1
fi
if [ "$flavour" = full ] && ! "$PYTHON" -c 'import torch' 2>/dev/null; then
    echo "build_linux: the full flavour needs PyTorch: $PYTHON -m pip install -e '.[torch]'" >&2
    exit 1
fi

started=$(date +%s)
echo "build_linux: building the $flavour bundle with PyInstaller" >&2
"$PYTHON" -m PyInstaller --noconfirm --clean --log-level WARN \
    --workpath "build/pyinstaller-$flavour" --distpath "dist/$flavour" \
    packaging/specdesk.spec -- --flavour "$flavour"

if [ "$flavour" = gguf ] && [ -e "$bundle/_internal/torch" ]; then
    echo "build_linux: torch is in the GGUF-only bundle ($bundle/_internal/torch)" >&2
    exit 1
fi
for lib in libxcb-cursor.so.0 libxcb-icccm.so.4 libxcb-keysyms.so.1; do
    if [ ! -e "$bundle/_internal/$lib" ]; then
        echo "build_linux: $lib is not in the bundle, so Qt's xcb plugin would not start on desktops" \
             "without it: apt-get install libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 and build again" >&2
        exit 1
    fi
done
# Paths of this machine (the checkout, the venv, the interpreter's prefix, pip's build
# folders) are compiled into some libraries: rewrite them, then prove none is left.
"$PYTHON" packaging/bundle_paths.py scrub "$bundle"
"$PYTHON" packaging/bundle_paths.py check "$bundle"
# The llama.cpp libraries must run on CPUs other than this one (scripts/llama_backend.py): each
# CPU variant module nothing above its own level (no AVX-512 below skylakex), everything else
# plain x86-64; or, in a build of one fixed level, nothing above it and no AVX-512 anywhere.
"$PYTHON" packaging/check_instructions.py "$bundle" --baseline "${SPECDESK_CPU_BASELINE:-auto}"

size=$(du -sb "$bundle" | cut -f1)
echo "build_linux: $bundle is $((size / 1000 / 1000)) MB unpacked ($size bytes)" >&2
if [ "$flavour" = gguf ] && [ "$size" -gt "$GGUF_LIMIT_BYTES" ]; then
    echo "build_linux: the GGUF-only bundle is over $((GGUF_LIMIT_BYTES / 1000 / 1000)) MB" >&2
    exit 1
fi

if [ "$selftest" = 1 ]; then
    # From an unrelated folder, with no venv on PATH: the bundle must need nothing of ours.
    (cd / && env -u VIRTUAL_ENV -u PYTHONPATH -u PYTHONHOME PATH=/usr/bin:/bin OMP_NUM_THREADS=1 \
        "$OLDPWD/$bundle/specdesk" --selftest)
    # The bundle's llama.cpp again, on emulated CPUs (QEMU user mode): an instruction the
    # disassembly missed stops it with SIGILL, and a bundle with CPU variants must load the one
    # made for each CPU: sse42 on a Nehalem (no AVX), haswell on a Haswell (AVX2, no AVX-512)
    # (packaging/cpu_capped_check.py).
    if [ "$(uname -m)" = x86_64 ] && command -v qemu-x86_64 >/dev/null 2>&1; then
        if ls "$bundle"/_internal/llama_cpp/lib/libggml-cpu-*.so >/dev/null 2>&1; then
            capped="Nehalem:sse42 Haswell-v4:haswell"
        else
            capped="${SPECDESK_QEMU_CPU:-Haswell-v4}:"
        fi
        for run in $capped; do
            cpu="${run%%:*}" variant="${run#*:}"
            echo "build_linux: llama.cpp on an emulated $cpu CPU (qemu-x86_64, about a minute)" >&2
            "$PYTHON" packaging/cpu_capped_check.py "$bundle" --cpu "$cpu" ${variant:+--expect-variant "$variant"}
        done
    else
        echo "build_linux: qemu-x86_64 is not installed (Debian: qemu-user): the CPU-capped run is skipped," \
             "the disassembly check stands alone" >&2
    fi
fi

if [ "$archive" = 1 ]; then
    name="specdesk-$version-linux-$arch-$flavour"
    stage="build/stage-$flavour/$name"
    rm -rf "build/stage-$flavour" && mkdir -p "$stage"
    cp -a "$bundle/." "$stage/"
    cp packaging/linux/specdesk.desktop packaging/linux/install-desktop-entry.sh "$stage/"
    cp packaging/icons/specdesk.png "$stage/specdesk.png"
    tar --sort=name --owner=0 --group=0 --numeric-owner -C "build/stage-$flavour" -czf "dist/$name.tar.gz" "$name"
    echo "build_linux: dist/$name.tar.gz ($(du -h "dist/$name.tar.gz" | cut -f1))" >&2

    if command -v appimagetool >/dev/null 2>&1; then
        appdir="build/stage-$flavour/SpecDesk.AppDir"
        rm -rf "$appdir" && mkdir -p "$appdir/usr/lib"
        cp -a "$bundle" "$appdir/usr/lib/specdesk"
        cp packaging/linux/specdesk.desktop "$appdir/specdesk.desktop"
        cp packaging/icons/specdesk.png "$appdir/specdesk.png"
        printf '#!/bin/sh\nexec "$(dirname "$(readlink -f "$0")")/usr/lib/specdesk/specdesk" "$@"\n' > "$appdir/AppRun"
        chmod +x "$appdir/AppRun"
        ARCH="$arch" appimagetool --no-appstream "$appdir" "dist/SpecDesk-$version-$arch-$flavour.AppImage"
        echo "build_linux: dist/SpecDesk-$version-$arch-$flavour.AppImage" >&2
    else
        echo "build_linux: appimagetool is not on PATH (neither Debian nor PyPI packages it): no AppImage" >&2
    fi
fi
echo "build_linux: done in $(( $(date +%s) - started )) s" >&2
