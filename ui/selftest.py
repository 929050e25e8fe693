"""`specdesk --selftest`: proves an install (a source checkout or a frozen bundle) works.

It runs what a user's first launch runs, in the order a broken bundle fails: the shipped
assets are found, Qt starts offscreen and builds the main window (plugins and pyqtgraph
are bundled), the demo family is derived from the shipped weights (numpy, safetensors,
gguf), llama.cpp loads its shared libraries, and a short speculative generation with the
demo draft gives exactly the greedy baseline's tokens. Everything is written to a
temporary folder that is removed afterwards, so the user's cache, settings and history
are never touched. One line per check; a failure says which check and why.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

SELFTEST_TOKENS = 32  # long enough for several draft steps, short enough for seconds on one core
SELFTEST_K = 4
SELFTEST_CTX = 512


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    detail: str


class SelftestFailure(Exception):
    """A check's own verdict (as opposed to an unexpected exception inside it)."""


def flavour() -> str:
    """'full' when PyTorch is importable (training and HF checkpoints work), else 'gguf-only'."""
    try:
        import torch  # noqa: F401
    except ImportError:
        return "gguf-only"
    return "full"


def check_assets(state: dict) -> str:
    from specdesk.app.storage.paths import assets_dir

    root = assets_dir()
    missing = [name for name in ("demo/card.json", "demo/tokenizer.json", "demo/core.safetensors",
                                 "demo/draft.safetensors", "prompts/code.jsonl") if not (root / name).is_file()]
    if missing:
        raise SelftestFailure(f"{root} lacks {', '.join(missing)}")
    prompt = json.loads((root / "prompts" / "code.jsonl").read_text(encoding="utf-8").splitlines()[0])["prompt"]
    state["prompt"] = prompt
    return str(root)


def check_qt(state: dict) -> str:
    """The main window builds and shows offscreen (models are not loaded here)."""
    from PySide6.QtCore import QCoreApplication

    from specdesk.ui.app import make_app
    from specdesk.ui.main_window import MainWindow

    app = make_app()
    window = MainWindow(settings_file=state["work"] / "settings.json", autoload=False)
    window.resize(800, 600)
    window.show()
    QCoreApplication.processEvents()
    shown = window.isVisible()
    platform_name = app.platformName()
    window.close()
    window.deleteLater()
    QCoreApplication.processEvents()
    if not shown:
        raise SelftestFailure("the main window did not become visible")
    return f"Qt platform {platform_name}"


def check_demo_family(state: dict) -> str:
    from specdesk.app.demo.install import build_family

    paths = build_family(out=state["work"] / "demo")
    state["paths"] = paths
    return "derived from the shipped weights"


def check_llama_build(state: dict) -> str:
    """llama.cpp's libraries load; which backend and CPU code this install carries."""
    from specdesk.engines.llama.devices import llama_build

    build = llama_build()
    offload = "yes" if build["gpu_offload"] else "no"
    variant = (f", variant {build['cpu_module']} of {len(build['cpu_modules'])} chosen for this CPU"
               if build.get("cpu_modules") else "")
    return (f"backend {build['backend']}, CPU code {build['cpu_variant']} ({' '.join(build['cpu_features'])}{variant}), "
            f"backends {', '.join(build['backends'])}; GPU offload: {offload}")


def check_speculative(state: dict) -> str:
    """Greedy speculative decoding with the demo draft must reproduce the baseline exactly."""
    from specdesk.app.runtime.generation import run_once
    from specdesk.engines.llama.engine import LlamaEngine
    from specdesk.engines.types import GenerationRequest, SamplingParams, SpecConfig

    paths = state["paths"]
    # One thread: the result does not depend on it, and a busy CI machine slows many threads down.
    engine = LlamaEngine(paths["target_gguf"], n_ctx=SELFTEST_CTX, n_threads=1)
    try:
        engine.load_draft(paths["draft_gguf"])
        prompt = tuple(engine.tokenize(state["prompt"]))
        greedy = SamplingParams()
        baseline = run_once(engine, GenerationRequest(prompt, SELFTEST_TOKENS, greedy, SpecConfig(),
                                                      stop_at_eos=False))
        spec = SpecConfig(method="draft", k=SELFTEST_K, draft_path=paths["draft_gguf"])
        speculative = run_once(engine, GenerationRequest(prompt, SELFTEST_TOKENS, greedy, spec, stop_at_eos=False))
    finally:
        engine.close()
    if len(baseline.tokens) != SELFTEST_TOKENS:
        raise SelftestFailure(f"the baseline produced {len(baseline.tokens)} tokens, expected {SELFTEST_TOKENS}")
    if speculative.tokens != baseline.tokens:
        at = next((i for i, (a, b) in enumerate(zip(speculative.tokens, baseline.tokens)) if a != b),
                  min(len(speculative.tokens), len(baseline.tokens)))
        raise SelftestFailure(f"speculative output differs from the greedy baseline at token {at} "
                              f"(baseline {list(baseline.tokens[at:at + 4])}, "
                              f"speculative {list(speculative.tokens[at:at + 4])})")
    stats = speculative.stats
    if stats.drafted == 0 or stats.accepted == 0:
        raise SelftestFailure(f"the demo draft was not used (drafted {stats.drafted}, accepted {stats.accepted})")
    return (f"{len(baseline.tokens)} tokens identical; drafted {stats.drafted}, accepted {stats.accepted}, "
            f"{stats.mean_accepted_length:.2f} tokens per pass")


def check_torch(state: dict) -> str:
    """Full flavour only: PyTorch's libraries load and compute (training runs on them)."""
    import torch

    product = torch.ones(2, 3) @ torch.ones(3, 2)
    if product.sum().item() != 12.0:
        raise SelftestFailure(f"torch computed {product.tolist()} for ones(2,3) @ ones(3,2)")
    return f"torch {torch.__version__}"


CHECKS: tuple[tuple[str, Callable[[dict], str]], ...] = (
    ("assets", check_assets),
    ("qt", check_qt),
    ("demo family", check_demo_family),
    ("llama.cpp", check_llama_build),
    ("speculative", check_speculative),
)


def checks_for(flavour_name: str) -> tuple[tuple[str, Callable[[dict], str]], ...]:
    return CHECKS + ((("torch", check_torch),) if flavour_name == "full" else ())


def run_checks(work: Path, out: Callable[[str], None], checks=CHECKS) -> list[CheckResult]:
    """Run the checks in order; a failed check stops the ones that depend on it (all later ones)."""
    state: dict = {"work": work}
    results = []
    for name, check in checks:
        started = time.perf_counter()
        try:
            detail = check(state) + f"; {time.perf_counter() - started:.1f} s"
            result = CheckResult(name, True, detail)
        except SelftestFailure as e:
            result = CheckResult(name, False, str(e))
        except Exception as e:  # the point of a selftest is to report any breakage, named
            last = traceback.extract_tb(e.__traceback__)[-1]
            result = CheckResult(name, False, f"{type(e).__name__}: {e} ({Path(last.filename).name}:{last.lineno})")
        results.append(result)
        out(f"selftest: {name}: {'ok' if result.ok else 'FAILED'} ({result.detail})")
        if not result.ok:
            break
    return results


def run_selftest(out: Optional[Callable[[str], None]] = None) -> int:
    """0 when every check passes; 1 (after printing what failed) otherwise."""
    out = out or (lambda line: print(line, flush=True))
    # Offscreen whatever the desktop: the selftest must run on CI machines with no display.
    os.environ["QT_QPA_PLATFORM"] = "offscreen"
    frozen = "bundle" if getattr(sys, "frozen", False) else "source"
    checks = checks_for(flavour())
    out(f"selftest: SpecDesk {_version()} from {frozen}, {flavour()} flavour, "
        f"Python {platform.python_version()} on {platform.system()} {platform.machine()}")
    work = Path(tempfile.mkdtemp(prefix="specdesk-selftest-"))
    saved = {k: os.environ.get(k) for k in ("SPECDESK_CONFIG_DIR", "SPECDESK_DATA_DIR", "SPECDESK_CACHE_DIR")}
    for key, sub in (("SPECDESK_CONFIG_DIR", "config"), ("SPECDESK_DATA_DIR", "data"), ("SPECDESK_CACHE_DIR", "cache")):
        os.environ[key] = str(work / sub)
    started = time.perf_counter()
    try:
        results = run_checks(work, out, checks)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(work, ignore_errors=True)
    failed = [r for r in results if not r.ok]
    if failed or len(results) != len(checks):
        skipped = [name for name, _ in checks[len(results):]]
        out(f"selftest: FAILED: {failed[0].name}: {failed[0].detail}"
            + (f" (not run: {', '.join(skipped)})" if skipped else ""))
        return 1
    out(f"selftest: passed ({len(results)} checks in {time.perf_counter() - started:.1f} s)")
    return 0


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("specdesk")
    except Exception:  # a frozen bundle may carry no distribution metadata
        return "(version unknown)"
