"""Mutation check of the verifiers: plausible bugs that the tests must catch.

Each mutant is one textual edit of engines/speculation/verify.py (numpy) or engines/torch/verify.py
(on the device). For each, the verifier tests run in a fresh pytest process with the mutated
module in place of the real one (this file, loaded as a pytest plugin with SPECDESK_MUTANT
set, compiles the edited source into the module before any test imports it; the files on
disk are never touched). A mutant is killed when some test fails.

    python tests/verifier_mutants.py            # one JSON line per mutant, then a summary; exit 1 if one survives
    python tests/verifier_mutants.py --only bonus-from-row-k-1
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

NUMPY = "specdesk.engines.speculation.verify"
TORCH = "specdesk.engines.torch.verify"
TESTS = ["tests/test_verify.py", "tests/test_torch_verify.py"]
TORCH_TESTS = ["tests/test_torch_verify.py", "tests/test_verify.py"]  # the draw-for-draw conformance first
ENGINE_TESTS = ["tests/test_llama_engine.py::test_greedy_speculative_equals_baseline"]


@dataclass(frozen=True)
class Mutant:
    name: str
    module: str
    old: str  # must occur exactly once in the module's source
    new: str
    tests: tuple[str, ...] = ()  # default: TESTS, or TORCH_TESTS for the torch module

    def test_files(self) -> tuple[str, ...]:
        return self.tests or tuple(TORCH_TESTS if self.module == TORCH else TESTS)


MUTANTS = [
    # --- engines/speculation/verify.py
    Mutant("bonus-from-row-k-1", NUMPY, "return VerifyResult(k, rows.sample(rows.row(k), rng))",
           "return VerifyResult(k, rows.sample(rows.row(max(k - 1, 0)), rng))"),
    Mutant("draft-probs-from-row-0", NUMPY, "q_row = np.asarray(draft_probs[position], dtype=np.float64)",
           "q_row = np.asarray(draft_probs[0], dtype=np.float64)"),
    Mutant("residual-is-p", NUMPY, "residual = p.probs - p.q_at(q_row)", "residual = p.probs.copy()"),
    Mutant("one-hot-residual-keeps-the-rejected-token", NUMPY, "                residual[at] = 0.0\n",
           "                pass\n"),
    Mutant("residual-from-p-before-top-k-top-p", NUMPY, "residual = p.probs - p.q_at(q_row)",
           "p = _row_probs(self._logits[position], SamplingParams(temperature=self._sampling.temperature)); "
           "residual = p.probs - p.q_at(q_row)"),
    # The target's rows, examined and bonus alike, come from one function (_HostRows.row), so
    # top-k/top-p dropped there is dropped on the target side of every row.
    Mutant("top-k-top-p-on-the-draft-side-only", NUMPY,
           "self._rows[position] = _row_probs(self._logits[position], self._sampling)",
           "self._rows[position] = _row_probs(self._logits[position],"
           " SamplingParams(temperature=self._sampling.temperature))"),
    Mutant("acceptance-ratio-inverted", NUMPY, "if rng.random() * q_token < p_token:",
           "if rng.random() * p_token < q_token:"),
    Mutant("sampled-always-accept", NUMPY, "if rng.random() * q_token < p_token:", "if rng.random() >= 0.0:"),
    Mutant("sampled-always-reject", NUMPY, "if rng.random() * q_token < p_token:", "if rng.random() < 0.0:"),
    Mutant("greedy-always-accept", NUMPY,
           "while accepted < k and int(draft_tokens[accepted]) == int(target_argmax[accepted]):",
           "while accepted < k:"),
    Mutant("greedy-always-reject", NUMPY,
           "while accepted < k and int(draft_tokens[accepted]) == int(target_argmax[accepted]):",
           "while False:", tests=(*TESTS, *ENGINE_TESTS)),
    # --- engines/torch/verify.py (its acceptance loop is accept_walk above; these are its rows)
    Mutant("torch-row-off-by-one", TORCH, "        return self._p[position]\n",
           "        return self._p[max(position - 1, 0)]\n"),
    Mutant("torch-draft-token-probs-from-row-0", TORCH, "torch.arange(k, device=self._p.device)",
           "torch.zeros(k, dtype=torch.long, device=self._p.device)"),
    Mutant("torch-residual-is-p", TORCH, "return (self._p[position] - q).clamp_(min=0.0)",
           "return self._p[position].clone()"),
    Mutant("torch-one-hot-residual-keeps-the-rejected-token", TORCH, "                residual[token] = 0.0\n",
           "                pass\n"),
    Mutant("torch-greedy-always-accept", TORCH, "accepted = int(torch.cumprod(matches, dim=0).sum())",
           "accepted = k"),
    Mutant("torch-greedy-always-reject", TORCH, "accepted = int(torch.cumprod(matches, dim=0).sum())",
           "accepted = 0"),
    Mutant("torch-top-k-ignored", TORCH, "if 0 < sampling.top_k < vocab:", "if False:"),
    Mutant("torch-top-p-ignored", TORCH, "return _nucleus(probs, sampling.top_p) if sampling.top_p < 1.0 else probs",
           "return probs"),
]
BY_NAME = {m.name: m for m in MUTANTS}


def mutated_source(mutant: Mutant) -> tuple[str, str]:
    """(path, source) of the mutant's module with its edit applied."""
    spec = importlib.util.find_spec(mutant.module)
    path = spec.origin
    source = Path(path).read_text(encoding="utf-8")
    count = source.count(mutant.old)
    if count != 1:
        raise SystemExit(f"verifier_mutants: {mutant.name}: the text to replace occurs {count} times in {path} "
                         "(the verifier changed: update the mutant)")
    return path, source.replace(mutant.old, mutant.new)


def pytest_configure(config) -> None:
    """As a pytest plugin: install the mutant named by SPECDESK_MUTANT before any test imports it."""
    name = os.environ.get("SPECDESK_MUTANT")
    if not name:
        return
    mutant = BY_NAME[name]
    path, source = mutated_source(mutant)
    spec = importlib.util.find_spec(mutant.module)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mutant.module] = module
    exec(compile(source, path, "exec"), module.__dict__)


def run(mutant: Mutant | None, root: Path) -> tuple[int, str, str, float]:
    """pytest's exit status, its last line, the first failed test and seconds, with the mutant
    (None: the real verifiers)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root / "tests"), os.environ.get("PYTHONPATH", "")]),
           "QT_QPA_PLATFORM": "offscreen"}
    tests = mutant.test_files() if mutant else tuple(dict.fromkeys([*TESTS, *ENGINE_TESTS]))
    if mutant:
        env["SPECDESK_MUTANT"] = mutant.name
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "verifier_mutants", "-p", "no:cacheprovider",
                           *tests], cwd=root, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.strip().splitlines() if line.strip()]
    failed = next((line.split()[1] for line in lines if line.startswith("FAILED ")), "")
    return (done.returncode, lines[-1] if lines else done.stderr.strip()[-200:], failed,
            time.perf_counter() - started)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(BY_NAME), help="run just this mutant (repeatable)")
    args = parser.parse_args(argv)
    root = Path(__file__).resolve().parent.parent
    for mutant in MUTANTS:
        mutated_source(mutant)  # every edit still applies, before spending time on runs
    status, last, _, seconds = run(None, root)
    if status != 0:
        print(json.dumps({"mutant": None, "error": "the tests fail without a mutant", "pytest": last}))
        return 2
    survivors = []
    for mutant in [BY_NAME[n] for n in args.only] if args.only else MUTANTS:
        status, last, failed, seconds = run(mutant, root)
        killed = status == 1  # 1: a test failed; anything else (2-5) is a broken run, not a kill
        if not killed:
            survivors.append(mutant.name)
        print(json.dumps({"mutant": mutant.name, "module": mutant.module.rsplit(".", 2)[-2] + "/verify.py",
                          "killed": killed, "by": failed, "pytest": last, "seconds": round(seconds, 1)}), flush=True)
    print(json.dumps({"mutants": len(args.only or MUTANTS), "survived": survivors}))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
