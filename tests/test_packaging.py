"""Installers: the selftest from source, the spec against the code it freezes, the build
scripts and CI workflow against the spec, and the path scrubbing on literal bytes.

Building a bundle takes minutes, so it is not done here: scripts/bundle_check.sh (run by
the test command when packaging/ or the dependencies change) builds the Linux bundle and
runs these same checks on it.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGING = ROOT / "packaging"
sys.path.insert(0, str(PACKAGING))

import bundle_key  # noqa: E402
import bundle_paths  # noqa: E402

CHECKS = ("assets", "qt", "demo family", "llama.cpp", "speculative")


def run_specdesk(args: list[str], env_extra: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", **env_extra}
    env.pop("QT_QPA_PLATFORM", None)  # the selftest must choose offscreen itself
    return subprocess.run([sys.executable, "-m", "specdesk.ui.cli", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT)


# --- selftest ----------------------------------------------------------------------
def test_selftest_passes_from_source_and_leaves_nothing_behind(tmp_path):
    dirs = {key: str(tmp_path / key.lower()) for key in ("SPECDESK_CONFIG_DIR", "SPECDESK_DATA_DIR",
                                                         "SPECDESK_CACHE_DIR")}
    result = run_specdesk(["--selftest"], {**dirs, "DISPLAY": "", "WAYLAND_DISPLAY": ""})
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("selftest: SpecDesk") and "from source" in lines[0]
    for check in CHECKS:
        assert any(line.startswith(f"selftest: {check}: ok") for line in lines), (check, result.stdout)
    speculative = next(line for line in lines if line.startswith("selftest: speculative"))
    assert re.search(r"32 tokens identical; drafted \d+, accepted [1-9]\d*", speculative)
    from specdesk.ui.selftest import flavour

    expected = CHECKS + (("torch",) if flavour() == "full" else ())
    assert any(line.startswith("selftest: torch: ok") for line in lines) == ("torch" in expected)
    assert lines[-1].startswith(f"selftest: passed ({len(expected)} checks")
    assert not any(Path(d).exists() for d in dirs.values()), "the selftest wrote outside its temporary folder"


def test_selftest_names_the_check_that_failed(tmp_path):
    result = run_specdesk(["--selftest"], {"SPECDESK_ASSETS_DIR": str(tmp_path)}, timeout=120)
    assert result.returncode == 1
    assert f"selftest: assets: FAILED ({tmp_path} lacks demo/card.json" in result.stdout
    assert result.stdout.splitlines()[-1].startswith(
        "selftest: FAILED: assets: ") and "(not run: qt, demo family, llama.cpp, speculative" in result.stdout


# --- the spec against the code it freezes ---------------------------------------------
def spec_lists() -> dict[str, list[str]]:
    """The module lists assigned in the spec (it runs only inside PyInstaller, so read, not run)."""
    tree = ast.parse((PACKAGING / "specdesk.spec").read_text(encoding="utf-8"))
    lists = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List) and len(node.targets) == 1:
            try:
                lists[node.targets[0].id] = ast.literal_eval(node.value)
            except (ValueError, AttributeError):
                continue
    return lists


def imported_modules(folder: Path) -> dict[str, set[str]]:
    """Absolute module names imported anywhere (also inside functions) under folder -> files."""
    found: dict[str, set[str]] = {}
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            for name in names:
                found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def test_spec_excludes_nothing_the_app_imports():
    lists = spec_lists()
    assert {"QT_UNUSED", "UNUSED", "TORCH"} <= set(lists)
    excluded = lists["QT_UNUSED"] + lists["UNUSED"]  # TORCH is left out of the GGUF-only flavour only
    offending = {}
    for folder in ("engines", "app", "ui"):
        for module, files in imported_modules(ROOT / folder).items():
            hit = [e for e in excluded if module == e or module.startswith(e + ".")]
            if hit:
                offending[module] = sorted(files)
    assert not offending, f"packaging/specdesk.spec excludes modules the app imports: {offending}"


def test_torch_stays_out_of_the_gguf_flavour_only():
    spec = (PACKAGING / "specdesk.spec").read_text(encoding="utf-8")
    assert 'choices=("gguf", "full")' in spec
    assert 'excludes = QT_UNUSED + UNUSED + (TORCH if options.flavour == "gguf" else [])' in spec
    assert "torch" in spec_lists()["TORCH"]


# --- build scripts and CI against the spec ------------------------------------------------
BUILD_SCRIPTS = {
    "linux": PACKAGING / "build_linux.sh",
    "windows": PACKAGING / "windows" / "build_windows.ps1",
    "macos": PACKAGING / "macos" / "build_macos.sh",
}


@pytest.mark.parametrize("platform_name", sorted(BUILD_SCRIPTS))
def test_each_build_script_freezes_the_spec_per_flavour_and_self_tests(platform_name):
    text = BUILD_SCRIPTS[platform_name].read_text(encoding="utf-8")
    assert "packaging/specdesk.spec" in text.replace("\\", "/")
    assert re.search(r"-- --flavour \S*flavour", text, re.IGNORECASE)
    assert "--selftest" in text
    assert "bundle_paths.py" in text  # scrub and check build-machine paths on every platform


def test_linux_build_script_enforces_the_size_limit_and_no_torch():
    text = BUILD_SCRIPTS["linux"].read_text(encoding="utf-8")
    assert "GGUF_LIMIT_BYTES=$((272 * 1000 * 1000))" in text
    assert '_internal/torch' in text


def test_inno_setup_script_installs_the_bundle_the_spec_makes():
    iss = next((PACKAGING / "windows").glob("*.iss")).read_text(encoding="utf-8")
    spec = (PACKAGING / "specdesk.spec").read_text(encoding="utf-8")
    assert 'executable("specdesk", ' in spec and 'executable("specdesk-cli", console=True)' in spec
    assert re.search(r'Source: "[^"]*dist\\{#Flavour}\\specdesk\\\*"', iss)
    assert '{app}\\specdesk.exe' in iss
    assert "specdesk.ico" in iss and (PACKAGING / "icons" / "specdesk.ico").is_file()


def test_ci_workflow_builds_both_flavours_on_three_platforms_and_self_tests():
    yaml = pytest.importorskip("yaml")
    workflow = yaml.safe_load((ROOT / ".github" / "workflows" / "installers.yml").read_text(encoding="utf-8"))
    jobs = workflow["jobs"]
    matrix = next(job["strategy"]["matrix"] for job in jobs.values() if "strategy" in job)
    assert {os_name.split("-")[0] for os_name in matrix["os"]} == {"ubuntu", "windows", "macos"}
    assert set(matrix["flavour"]) == {"gguf", "full"}
    steps = "\n".join(str(step.get("run", "")) for job in jobs.values() for step in job["steps"])
    for script in ("packaging/build_linux.sh", "packaging/windows/build_windows.ps1", "packaging/macos/build_macos.sh"):
        assert script in steps
    assert "--selftest" in steps


def test_desktop_entry_and_icons():
    entry = (PACKAGING / "linux" / "specdesk.desktop").read_text(encoding="utf-8").splitlines()
    assert entry[0] == "[Desktop Entry]"
    fields = dict(line.split("=", 1) for line in entry[1:] if "=" in line)
    assert fields["Type"] == "Application" and fields["Exec"] == "specdesk" and fields["Icon"] == "specdesk"
    assert "s|^Exec=specdesk|" in (PACKAGING / "linux" / "install-desktop-entry.sh").read_text(encoding="utf-8")
    from PySide6.QtGui import QImage

    for name, size in (("specdesk.png", 256), ("specdesk-512.png", 512), ("specdesk.ico", 256)):
        image = QImage(str(PACKAGING / "icons" / name))
        assert (image.width(), image.height()) == (size, size), name
    assert (PACKAGING / "icons" / "specdesk.icns").read_bytes()[:4] == b"icns"


# --- build-machine paths ----------------------------------------------------------------
ROOTS = ["/root/.pyenv/versions/3.11.7", "/work/main"]


def test_scrub_overwrites_only_the_first_component_keeping_lengths():
    pattern = bundle_paths.patterns(ROOTS)
    data = (b"\x00/root/.pyenv/versions/3.11.7/lib\x00/tmp/pip-install-ab12_c/llama-cpp-python_9f/ggml.c\x00"
            b"/work/main/.venv/lib\x00/home/qt/work/qt/qtbase/a.cpp\x00/dev/root\x00/org/a11y/root\x00")
    scrubbed, count = bundle_paths.scrub_bytes(data, pattern)
    assert count == 3 and len(scrubbed) == len(data)
    parts = scrubbed.split(b"\x00")
    assert parts[1] == b"././." + b"/.pyenv/versions/3.11.7/lib"
    assert parts[2] == b"./" * 11 + b"." + b"/llama-cpp-python_9f/ggml.c"  # pip's whole temporary folder
    assert parts[3] == b"././." + b"/main/.venv/lib"
    # Other machines' build paths and paths that merely end in "root" are not this machine's.
    assert parts[4:7] == [b"/home/qt/work/qt/qtbase/a.cpp", b"/dev/root", b"/org/a11y/root"]
    assert not pattern.search(scrubbed)


def test_scrub_keeps_a_merged_string_tail_intact():
    # A linker may store "3.11.7" as the tail of "/root/.pyenv/versions/3.11.7": it must survive.
    pattern = bundle_paths.patterns(ROOTS)
    data = b"\x00/root/.pyenv/versions/3.11.7\x00"
    tail_offset = data.index(b"3.11.7")
    scrubbed, _ = bundle_paths.scrub_bytes(data, pattern)
    assert scrubbed[tail_offset:].split(b"\x00")[0] == b"3.11.7"


def test_check_finds_paths_in_files_zips_and_symlinks_and_scrub_clears_the_files(tmp_path):
    pattern = bundle_paths.patterns(ROOTS)
    bundle = tmp_path / "bundle"
    (bundle / "_internal").mkdir(parents=True)
    (bundle / "_internal" / "libx.so").write_bytes(b"\x00\x01/work/main/src/x.c\x00ok\x00")
    with zipfile.ZipFile(bundle / "_internal" / "base_library.zip", "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr("mod.pyc", b"\x00/root/.pyenv/versions/3.11.7/lib/python3.11\x00")
    (bundle / "_internal" / "link").symlink_to("/work/main/.venv/lib/libfoo.so")
    hits = bundle_paths.check(bundle, pattern)
    where = sorted(h.where.replace(str(bundle / "_internal") + os.sep, "") for h in hits)
    assert where == ["base_library.zip!mod.pyc", "libx.so", "link (symlink target)"]
    changed = bundle_paths.scrub(bundle, pattern)
    assert [p.name for p in changed] == ["libx.so"]
    remaining = bundle_paths.check(bundle, pattern)
    assert {Path(h.where.split("!")[0].replace(" (symlink target)", "")).name for h in remaining} == \
        {"base_library.zip", "link"}  # archives and links cannot be rewritten: the build fails on them


def test_machine_roots_cover_the_checkout_and_interpreter():
    roots = bundle_paths.machine_roots()
    assert str(ROOT) in roots and os.path.realpath(sys.base_prefix) in roots
    assert "/" not in roots and "/usr" not in roots


# --- the bundle_check stamp ---------------------------------------------------------------
def test_bundle_key_follows_packaging_files(tmp_path):
    (tmp_path / "packaging").mkdir()
    (tmp_path / "packaging" / "specdesk.spec").write_text("a = 1\n")
    (tmp_path / "pyproject.toml").write_text("[project]\n")
    first = bundle_key.bundle_key(tmp_path)
    assert bundle_key.bundle_key(tmp_path) == first
    (tmp_path / "packaging" / "specdesk.spec").write_text("a = 2\n")
    assert bundle_key.bundle_key(tmp_path) != first
    (tmp_path / "unrelated.py").write_text("x = 1\n")
    second = bundle_key.bundle_key(tmp_path)
    (tmp_path / "unrelated.py").write_text("x = 2\n")
    assert bundle_key.bundle_key(tmp_path) == second


def test_bundle_check_is_silent_when_nothing_changed_and_builds_without_a_stamp(tmp_path):
    pytest.importorskip("PyInstaller")  # else the script would first install the packaging extra
    env = {**os.environ, "PYTHON": sys.executable, "BUNDLE_CHECK_STAMP": str(tmp_path / "stamp")}
    fresh = subprocess.run(["bash", "scripts/bundle_check.sh"], cwd=ROOT, capture_output=True, text=True,
                           env={**env, "BUNDLE_CHECK_DRY_RUN": "1"}, timeout=120)
    assert fresh.returncode == 0 and fresh.stdout.startswith("bundle_check: would build"), fresh.stderr
    (tmp_path / "stamp").write_text(bundle_key.bundle_key() + "\n")
    same = subprocess.run(["bash", "scripts/bundle_check.sh"], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=120)
    assert (same.returncode, same.stdout, same.stderr) == (0, "", "")


# --- instruction check ---------------------------------------------------------------
FAKE_KERNEL = """
#include <immintrin.h>
void add(const float *a, const float *b, float *out, int n) {
    for (int i = 0; i + 16 <= n; i += 16) {
        _mm512_storeu_ps(out + i, _mm512_add_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i)));
    }
}
"""


AVX2_KERNEL = FAKE_KERNEL.replace("__m512", "__m256").replace("_mm512_", "_mm256_").replace("16", "8")
AVX2_INT_KERNEL = """
#include <immintrin.h>
void add(const int *a, const int *b, int *out, int n) {
    for (int i = 0; i + 8 <= n; i += 8) {
        _mm256_storeu_si256((__m256i *)(out + i), _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(a + i)),
                                                                   _mm256_loadu_si256((const __m256i *)(b + i))));
    }
}
"""
AVX_PERMUTE_KERNEL = """
#include <immintrin.h>
void swap_halves(const float *a, float *out) { _mm256_storeu_ps(out, _mm256_permute2f128_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(a), 1)); }
"""
PLAIN_KERNEL = "void add(const float *a, const float *b, float *out, int n) { for (int i = 0; i < n; i++) out[i] = a[i] + b[i]; }"


def _fake_library(folder: Path, flags: list[str], source: str = FAKE_KERNEL, name: str = "libggml-cpu.so") -> Path:
    """A real shared library named like ggml's, compiled with these instruction-set flags."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernel.c").write_text(source)
    library = folder / name
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", *flags, str(folder / "kernel.c"), "-o", str(library)],
                   check=True, capture_output=True, timeout=120)
    return library


@pytest.mark.skipif(os.uname().machine != "x86_64" or not __import__("shutil").which("gcc"), reason="x86-64 with gcc")
def test_instruction_check_refuses_avx512_and_anything_above_the_baseline(tmp_path):
    import check_instructions

    avx512 = _fake_library(tmp_path / "avx512", ["-mavx512f"])
    findings = check_instructions.check_library(avx512, "x86-64-v3")
    assert findings and all("(AVX512, above x86-64-v3)" in f for f in findings) and ": add: " in findings[0]
    assert check_instructions.main([str(avx512.parent)]) == 1

    avx2 = _fake_library(tmp_path / "avx2", ["-mavx2", "-mfma"], AVX2_KERNEL)
    assert check_instructions.check_library(avx2, "x86-64-v3") == []
    assert check_instructions.main([str(avx2.parent), "--baseline", "x86-64-v3"]) == 0
    assert any("(AVX, above x86-64-v2)" in f for f in check_instructions.check_library(avx2, "x86-64-v2"))


@pytest.mark.skipif(os.uname().machine != "x86_64" or not __import__("shutil").which("gcc"), reason="x86-64 with gcc")
def test_instruction_check_holds_each_cpu_variant_to_its_own_level_and_the_rest_to_plain_x86_64(tmp_path):
    """A GGML_BACKEND_DL build: libggml-cpu-haswell may use AVX2 and libggml-cpu-skylakex AVX-512,
    but AVX2 in the sse42 module, or SSE4 in a library every CPU loads, is a finding."""
    import check_instructions

    good = tmp_path / "good"
    _fake_library(good, [], PLAIN_KERNEL, "libggml-cpu-x64.so")
    _fake_library(good, ["-msse4.2"], PLAIN_KERNEL, "libggml-cpu-sse42.so")
    _fake_library(good, ["-mavx"], AVX_PERMUTE_KERNEL, "libggml-cpu-sandybridge.so")  # AVX's own ymm shuffles
    _fake_library(good, ["-mavx2", "-mfma"], AVX2_KERNEL, "libggml-cpu-haswell.so")
    _fake_library(good, ["-mavx512f"], FAKE_KERNEL, "libggml-cpu-skylakex.so")
    _fake_library(good, [], PLAIN_KERNEL, "libggml-base.so.0")
    assert check_instructions.main([str(good)]) == 0  # auto: variants, since the modules are there

    sse4 = "#include <smmintrin.h>\nint f(__m128i a, __m128i b) { return _mm_testz_si128(a, b); }"
    # (a library rebuilt with these flags, its level, the finding)
    for flags, source, name, level, finding in ((["-mavx2"], AVX2_KERNEL, "libggml-cpu-sse42.so", "sse42", ", above sse42)"),
                                                (["-mavx2"], AVX2_INT_KERNEL, "libggml-cpu-sandybridge.so", "sandybridge",
                                                 "(AVX2, above sandybridge)"),
                                                (["-msse4.1"], sse4, "libggml-base.so.0", "x86-64", "(SSE42, above x86-64)")):
        bad = tmp_path / f"bad-{name}"
        shutil.copytree(good, bad)
        _fake_library(bad, flags, source, name)
        assert check_instructions.main([str(bad)]) == 1, name
        assert any(finding in f for f in check_instructions.check_library(bad / name, level)), name

    no_baseline = tmp_path / "no_baseline"
    _fake_library(no_baseline, ["-mavx2", "-mfma"], AVX2_KERNEL, "libggml-cpu-haswell.so")
    assert check_instructions.main([str(no_baseline)]) == 1  # nothing would run on a CPU without AVX2


def test_linux_build_checks_the_instructions_of_what_it_ships():
    script = (PACKAGING / "build_linux.sh").read_text()
    assert "packaging/check_instructions.py" in script
    assert script.index("check_instructions.py") < script.index("--selftest")


def _capped_run(bundle: Path, cpu: str, *expect: str) -> subprocess.CompletedProcess:
    # As some hosts set it (the host's OpenBLAS core): the emulated CPU must not inherit it.
    env = {**os.environ, "OPENBLAS_CORETYPE": "Haswell"}
    return subprocess.run([sys.executable, str(PACKAGING / "cpu_capped_check.py"), str(bundle), "--cpu", cpu, *expect],
                          capture_output=True, text=True, timeout=600, env=env)


def test_the_emulated_cpu_gets_an_environment_for_itself_not_for_the_host():
    sys.path.insert(0, str(PACKAGING))
    try:
        from cpu_capped_check import emulated_env
    finally:
        sys.path.remove(str(PACKAGING))
    host = {"PATH": "/usr/bin", "OPENBLAS_CORETYPE": "Haswell", "NPY_ENABLE_CPU_FEATURES": "AVX512F",
            "SPECDESK_LLAMA_CPU_MODULE": "/opt/lib/libggml-cpu-zen4.so"}
    assert emulated_env("Nehalem", host) == {"PATH": "/usr/bin", "OPENBLAS_CORETYPE": "NEHALEM"}
    assert emulated_env("Haswell-v4", host)["OPENBLAS_CORETYPE"] == "HASWELL"
    assert emulated_env("qemu64", host) == {"PATH": "/usr/bin"}  # not in the table: OpenBLAS reads CPUID


@pytest.mark.skipif(os.uname().machine != "x86_64" or not __import__("shutil").which("qemu-x86_64"),
                    reason="x86-64 with qemu-user")
def test_on_an_emulated_old_cpu_the_variant_made_for_it_runs_and_one_above_it_is_refused(tmp_path):
    """On an emulated Nehalem (SSE4.2, no AVX): this install's llama.cpp, built with run-time CPU
    variants, loads its sse42 module and decodes the demo pair identically. The same libraries
    with only the Haswell module (AVX2) do not crash there: ggml's score refuses the module, and
    the load stops with one line naming the folder."""
    import llama_cpp

    from specdesk.engines.llama.devices import llama_build

    lib = Path(llama_cpp.__file__).parent / "lib"
    if not llama_build()["cpu_modules"]:
        pytest.skip("this install's llama.cpp has no run-time CPU variants (SPECDESK_LLAMA_CPU set)")
    full = tmp_path / "full" / "_internal" / "llama_cpp"
    full.mkdir(parents=True)
    (full / "lib").symlink_to(lib)
    done = _capped_run(tmp_path / "full", "Nehalem", "--expect-variant", "sse42")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1])["cpu_module"] == "sse42"

    fixed = tmp_path / "fixed" / "_internal" / "llama_cpp" / "lib"
    fixed.mkdir(parents=True)
    for library in lib.iterdir():
        if not library.name.startswith("libggml-cpu-"):
            (fixed / library.name).symlink_to(library)
    (fixed / "libggml-cpu-haswell.so").symlink_to(lib / "libggml-cpu-haswell.so")
    done = _capped_run(tmp_path / "fixed", "Nehalem")
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("cpu_capped_check: the bundle's llama.cpp failed on an emulated Nehalem: ") and \
        f"llama.cpp found no CPU backend in {fixed}" in last and "none runs on this CPU" in last, last
