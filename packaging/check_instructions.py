"""Checks that the llama.cpp libraries in a bundle carry no CPU instructions above what they may use.

    python packaging/check_instructions.py BUNDLE_DIR [--baseline auto|variants|x86-64-v3|x86-64-v2]

llama.cpp compiled with GGML_NATIVE=ON (its default) targets the build machine's CPU: a
bundle built on a machine with AVX-512 dies with SIGILL ("Illegal instruction") at the first
matrix product on most consumer CPUs. This disassembles every ggml/llama/mtmd library in the
bundle (objdump, from binutils) and fails, naming the library, the function and the
instruction, when one uses an instruction-set extension it may not:
  - variants (a GGML_BACKEND_DL build with GGML_CPU_ALL_VARIANTS; `auto` picks it when the
    bundle has libggml-cpu-<level> modules): each CPU module only what its level has, as
    ggml's CMakeLists builds them (sse42: SSE4.2 and nothing VEX-encoded; haswell: AVX2, FMA,
    F16C, BMI2 and no AVX-512; skylakex: AVX-512 ...), and every other library (libllama,
    libggml, libggml-base, the RPC and GPU modules) plain x86-64: no SSE4, no VEX at all, since
    they are loaded on every CPU;
  - x86-64-v3 (one fixed level, AVX2, FMA, F16C, BMI2): no AVX-512 anywhere, no AVX-VNNI,
    AVX-512-BF16 or AMX;
  - x86-64-v2 (SSE4.2): also nothing VEX-encoded (AVX, AVX2, FMA, F16C) and no BMI2.
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
CPU_MODULE = re.compile(r"^(?:lib)?ggml-cpu-([a-z0-9]+)\.(?:so(?:\.\d+)*|dll)$")

# Each extension, by the instructions (AT&T syntax, objdump -d) that need it. An instruction
# needs every extension whose pattern it matches (vfmadd231ps on zmm: FMA, AVX512 and AVX);
# a finding names the first one, in this order, that the library's level lacks.
EVEX_ONLY = (r"vpternlog[dq]|vmovdqu(8|16|32|64)|vmovdqa(32|64)|vperm[it]2\w+|vpabsq|vpmullq|vpsraq|vpsravq|"
             r"vpro[lr]v?[dq]|vpmov(q[bwd]|d[bw]|wb|s(q[bwd]|d[bw]|wb)|us(q[bwd]|d[bw]|wb)|[bwdq]2m|m2[bwdq])|"
             r"vpcompress\w|vpexpand\w|vcompressp[sd]|vexpandp[sd]|vcvtt?p[sd]2u\w+|vcvtu\w+|vcvtt?s[sd]2usi|"
             r"vcvtt?p[sd]2qq|vcvtqq2p[sd]|vrndscale\w+|vrange\w+|vgetexp\w+|vgetmant\w+|vscalef\w+|"
             r"vfixupimm\w+|vrcp14\w+|vrsqrt14\w+|v(insert|extract)[if](32x4|32x8|64x2|64x4)|vshuf[if](32x4|64x2)|"
             r"valign[dq]|vpconflict\w|vplzcnt\w|vpopcnt\w|vdbpsadbw|vpmadd52\w+|vpsh[lr]dv?\w|vpbroadcastm\w+|"
             r"vfpclass\w+|vreduce\w+|k(mov|and|andn|or|xor|xnor|not|shiftl|shiftr|test|ortest|add|unpck)\w*")
EXTENSIONS = {
    "AMX": re.compile(r"^\s*(ldtilecfg|sttilecfg|tileloadd|tileloaddt1|tilestored|tilezero|tilerelease|tdp\w+)\b"),
    "AVX512_BF16": re.compile(r"^\s*(vdpbf16ps|vcvtne2ps2bf16|vcvtneps2bf16)\b"),
    "AVX512_VBMI": re.compile(r"^\s*(vpermb|vpermi2b|vpermt2b|vpmultishiftqb)\b"),
    "AVX_VNNI": re.compile(r"^\s*\{vex\}\s*vpdp(bus|ws)ds?\b"),
    "AVX512_VNNI": re.compile(r"^\s*vpdp(bus|ws)ds?\b"),
    "AVX512": re.compile(r"%zmm\d|%k[0-7]\b|\{%k[0-7]\}|\{1to\d+\}|%[xy]mm(1[6-9]|2\d|3[01])\b|"
                         r"^\s*(" + EVEX_ONLY + r")\b|^\s*vpbroadcast[bwdq]\s+%(?![xyz]mm)"),
    "FMA": re.compile(r"^\s*vfn?m(add|sub)\w*\b"),
    "F16C": re.compile(r"^\s*(vcvtph2ps|vcvtps2ph)\b"),
    "AVX2": re.compile(r"^\s*(vp(?!erm2f128\b|ermilp[sd]\b|test\b)\w*\s.*%ymm\d|vperm2i128|vpermd|vpermq|vpermps|"
                       r"vpermpd|v(p)?gather\w+|vpbroadcast\w+|vbroadcasti128|vbroadcasts[sd]\s+%xmm\d+|vinserti128|"
                       r"vextracti128|vpmaskmov\w+|vps[lr]lv\w+|vpsrav\w+|vpblendd)\b"),
    "BMI2": re.compile(r"^\s*(shlx|shrx|sarx|rorx|bzhi|pdep|pext|mulx)\b"),
    # BMI1, LZCNT and MOVBE (x86-64-v3). Not tzcnt: compilers emit it as `rep bsf` for every
    # CPU (objdump prints it as tzcnt), and an older CPU runs it as bsf.
    "BMI": re.compile(r"^\s*(andn|bextr|blsi|blsmsk|blsr|lzcnt|movbe)\b"),
    "AVX": re.compile(r"^\s*(\{vex\}\s*)?v[a-z0-9]+\b|%ymm\d"),
    # SSE3, SSSE3, SSE4.1, SSE4.2 and POPCNT: what x86-64-v2 adds to plain x86-64 (SSE2)
    "SSE42": re.compile(r"^\s*(pshufb|pmaddubsw|pmulhrsw|palignr|phadd\w+|phsub\w+|pabs[bwd]|psign[bwd]|ptest|"
                        r"pblend\w*|blendv?p[sd]|pmulld|pmuldq|pmin(sb|sd|uw|ud)|pmax(sb|sd|uw|ud)|pcmp[ei]str[im]|"
                        r"crc32\w*|round[ps][sd]|dpp[sd]|insertps|extractps|pextr[bdq]|pinsr[bdq]|pmov[sz]x\w+|"
                        r"packusdw|pcmpeqq|pcmpgtq|popcnt|movntdqa|mpsadbw|phminposuw|addsubp[sd]|h(add|sub)p[sd]|"
                        r"movddup|movs[hl]dup|lddqu)\b"),
}
HASWELL = {"SSE42", "AVX", "F16C", "FMA", "AVX2", "BMI2", "BMI"}
AVX512_LEVEL = HASWELL | {"AVX512"}
# What each level may use: the fixed levels, and ggml's CPU modules (ggml/src/CMakeLists.txt,
# GGML_CPU_ALL_VARIANTS).
LEVELS = {
    "x86-64": set(), "x86-64-v2": {"SSE42"}, "x86-64-v3": HASWELL,
    "x64": set(), "sse42": {"SSE42"}, "sandybridge": {"SSE42", "AVX"}, "ivybridge": {"SSE42", "AVX", "F16C"},
    "piledriver": {"SSE42", "AVX", "F16C", "FMA"}, "haswell": HASWELL, "alderlake": HASWELL | {"AVX_VNNI"},
    "skylakex": AVX512_LEVEL, "cannonlake": AVX512_LEVEL | {"AVX512_VBMI"},
    "cascadelake": AVX512_LEVEL | {"AVX512_VNNI"}, "icelake": AVX512_LEVEL | {"AVX512_VBMI", "AVX512_VNNI"},
    "cooperlake": AVX512_LEVEL | {"AVX512_VNNI", "AVX512_BF16"},
    "zen4": AVX512_LEVEL | {"AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"},
    "sapphirerapids": AVX512_LEVEL | {"AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16", "AMX"},
}


def level_of(path: Path, baseline: str) -> str:
    """What a library may use: its own level for a CPU module of a variants build, else the
    build's baseline (plain x86-64 for the rest of a variants build)."""
    match = CPU_MODULE.match(path.name)
    if baseline == "variants":
        return match.group(1) if match else "x86-64"
    return baseline


def rules(level: str) -> list[tuple[str, re.Pattern]]:
    allowed = LEVELS.get(level)
    if allowed is None:
        raise SystemExit(f"check_instructions: {level!r} is not a CPU level this check knows: {', '.join(LEVELS)}")
    return [(f"{name}, above {level}", pattern) for name, pattern in EXTENSIONS.items() if name not in allowed]


def libraries(bundle: Path) -> list[Path]:
    """The llama.cpp libraries, each once: a wheel holds libfoo.so, .so.0 and .so.0.x as copies."""
    import hashlib

    seen, found = set(), []
    for path in sorted(p for p in bundle.rglob("*") if p.is_file() and not p.is_symlink() and LIBRARY.match(p.name)):
        copy = (path.parent, path.name.split(".so")[0], hashlib.sha256(path.read_bytes()).hexdigest())
        if copy not in seen:
            seen.add(copy)
            found.append(path)
    return found


def check_library(path: Path, level: str, limit: int = 5) -> list[str]:
    """Findings as "library: function: instruction (extension, above level)", at most `limit`
    per extension. An instruction counts once, for the first extension (in EXTENSIONS' order)
    that it needs and the level lacks."""
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-M", "att", str(path)], capture_output=True,
                          text=True, check=True).stdout
    allowed = LEVELS[level]
    checks = rules(level)
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
        # every extension the instruction needs must be in the level; the first it lacks is named
        owner = next((name for name, pattern in EXTENSIONS.items()
                      if name not in allowed and pattern.search(instruction)), None)
        if owner is None:
            continue
        for name, pattern in checks:
            if name.startswith(owner + ","):
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
    parser.add_argument("--baseline", default="auto", choices=["auto", "variants", "x86-64-v3", "x86-64-v2"])
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
    modules = sorted({match.group(1) for match in (CPU_MODULE.match(p.name) for p in found) if match})
    baseline = args.baseline if args.baseline != "auto" else ("variants" if modules else "x86-64-v3")
    if baseline == "variants" and not {"x64", "sse42"} & set(modules):
        print(f"check_instructions: no baseline CPU module (libggml-cpu-x64 or -sse42) under {args.bundle}: "
              "llama.cpp was not built with GGML_CPU_ALL_VARIANTS", file=sys.stderr)
        return 1
    levels = {library: level_of(library, baseline) for library in found}
    findings = [finding for library in found for finding in check_library(library, levels[library])]
    print(json.dumps({"baseline": baseline, "checked": {str(p.relative_to(args.bundle)): levels[p] for p in found},
                      "findings": len(findings)}))
    for finding in findings:
        print(f"check_instructions: {finding}", file=sys.stderr)
    if findings:
        print(f"check_instructions: the bundle's llama.cpp libraries use instructions above their level ({baseline}): "
              "they would stop with SIGILL on CPUs without them; build llama-cpp-python with GGML_NATIVE=OFF "
              "(scripts/setup.sh does)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
