"""Checks that the llama.cpp libraries in a bundle carry no CPU instructions above a baseline.

    python packaging/check_instructions.py BUNDLE_DIR [--baseline x86-64-v3|x86-64-v2]

llama.cpp compiled with GGML_NATIVE=ON (its default) targets the build machine's CPU: a
bundle built on a machine with AVX-512 dies with SIGILL ("Illegal instruction") at the first
matrix product on most consumer CPUs. This disassembles every ggml/llama/mtmd library in the
bundle (objdump, from binutils) and fails, naming the library, the function and the
instruction, when one uses:
  - AVX-512 anywhere (zmm registers, opmask registers k0-k7, embedded broadcasts), or AMX;
  - for x86-64-v3 (AVX2, FMA, F16C, BMI2): also AVX-VNNI and AVX-512-BF16;
  - for x86-64-v2 (SSE4.2): also any VEX-encoded instruction (AVX, AVX2, FMA, F16C) and BMI2.
Prints one JSON line with what it checked. Exit status 1 on a finding, 2 on bad usage.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

LIBRARY = re.compile(r"^lib(ggml|llama|mtmd)[\w-]*\.so(\.\d+)*$|^(ggml|llama|mtmd)[\w-]*\.dll$")
AVX512 = re.compile(r"%zmm\d|%k[0-7]\b|\{%k[0-7]\}|\{1to\d+\}")
AMX = re.compile(r"^\s*(ldtilecfg|sttilecfg|tileloadd|tileloaddt1|tilestored|tilezero|tilerelease|tdp\w+)\b")
ABOVE_V3 = re.compile(r"^\s*(\{vex\}\s*)?(vpdpbusd|vpdpbusds|vpdpwssd|vpdpwssds|vdpbf16ps|vcvtne2ps2bf16|vcvtneps2bf16)\b")
ABOVE_V2 = re.compile(r"^\s*(v[a-z0-9]+|shlx|shrx|sarx|rorx|bzhi|pdep|pext|mulx|andn)\b|%ymm\d")


def rules(baseline: str) -> list[tuple[str, re.Pattern]]:
    found = [("AVX-512", AVX512), ("AMX", AMX)]
    if baseline in ("x86-64-v3", "x86-64-v2"):
        found.append((f"above {baseline} (AVX-VNNI / AVX-512-BF16)", ABOVE_V3))
    if baseline == "x86-64-v2":
        found.append(("above x86-64-v2 (AVX / AVX2 / FMA / F16C / BMI2)", ABOVE_V2))
    return found


def libraries(bundle: Path) -> list[Path]:
    """The llama.cpp libraries, each once: a wheel holds libfoo.so, .so.0 and .so.0.x as copies."""
    import hashlib

    seen, found = set(), []
    for path in sorted(p for p in bundle.rglob("*") if p.is_file() and not p.is_symlink() and LIBRARY.match(p.name)):
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest not in seen:
            seen.add(digest)
            found.append(path)
    return found


def check_library(path: Path, baseline: str, limit: int = 5) -> list[str]:
    """Findings as "library: function: instruction (rule)", at most `limit` per rule."""
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-M", "att", str(path)], capture_output=True,
                          text=True, check=True).stdout
    checks = rules(baseline)
    counts = {name: 0 for name, _ in checks}
    findings, function = [], "?"
    for line in dump.splitlines():
        if line.endswith(">:"):
            function = line[line.find("<") + 1:-2]
            continue
        tab = line.find("\t")
        if tab < 0:
            continue
        instruction = line[tab + 1:]
        for name, pattern in checks:
            if pattern.search(instruction):
                counts[name] += 1
                if counts[name] <= limit:
                    findings.append(f"{path.name}: {function}: {instruction.strip()} ({name})")
    for name, count in counts.items():
        if count > limit:
            findings.append(f"{path.name}: {count - limit} more ({name})")
    return findings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundle", type=Path)
    parser.add_argument("--baseline", default="x86-64-v3", choices=["x86-64-v3", "x86-64-v2"])
    args = parser.parse_args(argv)
    if platform.machine() not in ("x86_64", "AMD64"):
        print(json.dumps({"checked": [], "skipped": f"not x86-64 ({platform.machine()})"}))
        return 0
    if shutil.which("objdump") is None:
        print("check_instructions: objdump is missing: install binutils", file=sys.stderr)
        return 2
    found = libraries(args.bundle)
    if not found:
        print(f"check_instructions: no ggml/llama library under {args.bundle}", file=sys.stderr)
        return 2
    findings = [finding for library in found for finding in check_library(library, args.baseline)]
    print(json.dumps({"baseline": args.baseline, "checked": [str(p.relative_to(args.bundle)) for p in found],
                      "findings": len(findings)}))
    for finding in findings:
        print(f"check_instructions: {finding}", file=sys.stderr)
    if findings:
        print(f"check_instructions: the bundle's llama.cpp libraries use instructions above {args.baseline}: "
              "they would stop with SIGILL on CPUs without them; build llama-cpp-python with GGML_NATIVE=OFF "
              "(scripts/setup.sh does)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
