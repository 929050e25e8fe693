"""SpecDesk's llama.cpp engine against llama.cpp's own speculative driver, on the same files.

llama.cpp's `llama-speculative-simple` (examples/speculative-simple, which drives
common/speculative.cpp) is built once from the source llama-cpp-python vendors, CPU only,
that target alone, and cached under <cache>/llama-native/<version>/ (several minutes on two
cores the first time). Then, for each method, every prompt of assets/prompts/code.jsonl is
decoded greedily by both on the same GGUF files, the same k and the same thread count:

  draft   draft-simple, the demo target + the demo draft GGUF
  ngram   ngram-simple (native) vs prompt lookup (SpecDesk); not the same algorithm, so
          acceptance is printed beside the speed
  mtp     draft-mtp on the demo target exported as glm4moe with its MTP layer
  dflash  draft-dflash, the demo target + the demo DFlash drafter GGUF
  eagle3  draft-eagle3, the demo target + the demo EAGLE-3 drafter GGUF
(the driver refuses --spec-type none, so there is no baseline row).

`--build-server` builds llama-server the same way (its own build folder beside the driver's)
and prints its path: the served-engine tests (tests/test_llama_server.py) and
benchmarks/served.py run it on the demo pair with `--metrics` (start_server below).

Speeds are decode-only on both sides: llama.cpp's "decoded N tokens in S seconds" line
(timed after the prompt is evaluated) and SpecDesk's wall time of a generation whose prompt
is already in the cache (a one-token warm-up run evaluates it); each prompt runs --repeat
times on each side and the fastest run counts. One JSON line per method:
{"method", "k", "specdesk_tok_s", "native_tok_s", "ratio", acceptance of both, tokens}.
Usage: python benchmarks/native_drivers.py [--methods draft,ngram,mtp,dflash,eagle3] [--k 4]
       [--max-tokens 64] [--threads 2] [--small] [--prompts N] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from importlib import metadata
from pathlib import Path
from typing import Optional

from specdesk.app.runtime.compare import load_prompts
from specdesk.app.storage.paths import assets_dir, building, cache_dir
from specdesk.engines.llama.engine import LlamaEngine
from specdesk.engines.types import GenerationRequest, SpecConfig

TARGET = "llama-speculative-simple"
NATIVE_TYPES = {"draft": "draft-simple", "ngram": "ngram-simple", "mtp": "draft-mtp",
                "dflash": "draft-dflash", "eagle3": "draft-eagle3"}


# --- building llama.cpp's driver ---------------------------------------------------------
def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def vendored_source(root: Path, version: str) -> Path:
    """vendor/llama.cpp of the llama-cpp-python sdist of `version`, fetched with pip once."""
    src = root / "src"
    if (src / "CMakeLists.txt").is_file():
        return src
    with building(src):
        if not (src / "CMakeLists.txt").is_file():  # another process fetched it meanwhile
            _fetch_source(root, version, src)
    return src


def _fetch_source(root: Path, version: str, src: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        log(f"downloading the llama-cpp-python {version} source with pip")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                        f"llama-cpp-python=={version}", "-d", tmp], check=True, stdout=subprocess.DEVNULL)
        archive = next(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        with tarfile.open(archive) as tar:
            tar.extractall(tmp, filter="data")
        vendored = next(Path(tmp).glob("llama_cpp_python-*/vendor/llama.cpp"))
        partial = root / "src.partial"
        shutil.rmtree(partial, ignore_errors=True)
        shutil.copytree(vendored, partial)
        partial.rename(src)


SERVER = "llama-server"
BUILDS = {  # target -> (build folder, CMake options beyond the common ones)
    TARGET: ("build", ["-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DLLAMA_BUILD_EXAMPLES=ON"]),
    SERVER: ("build-server", ["-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_EXAMPLES=OFF",
                              "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF"]),
}


def native_binary(target: str = TARGET) -> Path:
    """Where the cached `target` binary lives (it may not be built yet)."""
    folder = BUILDS[target][0]
    return cache_dir() / "llama-native" / metadata.version("llama-cpp-python") / folder / "bin" / target


def build_driver(jobs: int = 2, target: str = TARGET) -> Path:
    """The cached binary of `target` (llama-speculative-simple or llama-server), built first
    if needed (CPU, Release, that target alone; the source is fetched once for both)."""
    binary = native_binary(target)
    if binary.is_file():
        return binary
    version = metadata.version("llama-cpp-python")
    root = cache_dir() / "llama-native" / version
    src = vendored_source(root, version)
    folder, options = BUILDS[target]
    build = root / folder
    log(f"building {target} from {src} (CPU only; several minutes on two cores, once)")
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    subprocess.run(["cmake", "-S", str(src), "-B", str(build), *generator, "-DCMAKE_BUILD_TYPE=Release",
                    "-DLLAMA_BUILD_TESTS=OFF", *options, "-DLLAMA_BUILD_APP=OFF", "-DLLAMA_CURL=OFF",
                    "-DLLAMA_OPENSSL=OFF", "-DGGML_CUDA=OFF", "-DBUILD_SHARED_LIBS=OFF"],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", str(build), "-j", str(jobs), "--target", target], check=True,
                   stdout=subprocess.DEVNULL)
    return binary


# --- llama-server -------------------------------------------------------------------------
def server_command(binary: Path, target: str, port: int, draft: Optional[str] = None, k: int = 4,
                   threads: int = 1, n_ctx: int = 1024) -> list[str]:
    """llama-server on `target`, speculating with `draft` (draft-simple, k tokens, no p-min
    cut) when given, one slot, with the Prometheus /metrics SpecDesk reads."""
    command = [str(binary), "-m", target, "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
               "-tb", str(threads), "-c", str(n_ctx), "-np", "1", "--metrics", "--no-webui"]
    if draft:
        command += ["-md", draft, "--spec-type", "draft-simple", "--spec-draft-n-max", str(k),
                    "--spec-draft-p-min", "0"]
    return command


def start_server(binary: Path, target: str, draft: Optional[str] = None, k: int = 4, threads: int = 1,
                 n_ctx: int = 1024, timeout_s: float = 120.0) -> tuple[subprocess.Popen, str]:
    """A running llama-server on a free localhost port: (process, its base URL)."""
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_file = tempfile.TemporaryFile()
    child = subprocess.Popen(server_command(binary, target, port, draft, k, threads, n_ctx),
                             stdout=log_file, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and child.poll() is None:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as response:
                if response.status == 200:
                    return child, url
        except OSError:
            time.sleep(0.2)
    child.kill()
    child.wait()
    log_file.seek(0)
    tail = "\n".join(log_file.read().decode(errors="replace").strip().splitlines()[-8:])
    raise RuntimeError(f"llama-server did not come up on {url} (exit {child.returncode}):\n{tail}")


def stop_server(child: subprocess.Popen) -> None:
    child.terminate()
    try:
        child.wait(15)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()


# --- one prompt, both drivers ------------------------------------------------------------
DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
ACCEPTED = re.compile(r"n_accept\s*=\s*(\d+)")


def run_native(binary: Path, method: str, files: dict, prompt: str, k: int, max_tokens: int,
               threads: int, n_ctx: int) -> dict:
    target = files["mtp_gguf"] if method == "mtp" else files["target_gguf"]
    args = [str(binary), "-m", target, "-p", prompt, "-n", str(max_tokens), "--temp", "0", "-s", "1",
            "-t", str(threads), "-tb", str(threads), "-c", str(n_ctx), "--spec-type", NATIVE_TYPES[method],
            "--spec-draft-n-max", str(k), "--spec-draft-p-min", "0"]
    if method == "draft":
        args += ["-md", files["draft_gguf"]]
    if method in ("dflash", "eagle3"):
        args += ["-md", files[f"{method}_gguf"]]
    if method == "ngram":
        args += ["--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", str(k)]
    for _ in range(3):  # llama.cpp logs from a worker thread and can exit before the last lines are out
        done = subprocess.run(args, capture_output=True, text=True, errors="replace")
        out = done.stdout + done.stderr
        match = DECODED.search(out)
        if match or done.returncode != 0:
            break
    if done.returncode != 0 or not match:
        tail = "\n".join(out.strip().splitlines()[-8:])
        raise RuntimeError(f"{TARGET} failed for {method} (exit {done.returncode}):\n{tail}")
    drafted, accepted = DRAFTED.search(out), ACCEPTED.search(out)
    return {"tokens": int(match.group(1)), "seconds": float(match.group(2)),
            "drafted": int(drafted.group(1)) if drafted else 0, "accepted": int(accepted.group(1)) if accepted else 0}


def run_specdesk(engine: LlamaEngine, method: str, files: dict, prompt: str, k: int, max_tokens: int) -> dict:
    draft_path = {"draft": files["draft_gguf"], "dflash": files["dflash_gguf"], "eagle3": files["eagle3_gguf"]}.get(method)
    spec = SpecConfig(method=method, k=k, draft_path=draft_path)
    tokens = tuple(engine.tokenize(prompt))
    for _ in engine.generate(GenerationRequest(tokens, max_tokens=1, spec=spec), threading.Event()):
        pass  # warm-up: the prompt is now in the target's (and the drafter's) cache
    request = GenerationRequest(tokens, max_tokens=max_tokens, spec=spec)
    count = drafted = accepted = 0
    started = time.perf_counter()
    for event in engine.generate(request, threading.Event()):
        count += len(event.tokens)
        drafted += event.drafted
        accepted += event.accepted
    return {"tokens": count, "seconds": time.perf_counter() - started, "drafted": drafted, "accepted": accepted}


def summarise(runs: list[dict]) -> dict:
    tokens = sum(r["tokens"] for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    drafted = sum(r["drafted"] for r in runs)
    return {"tok_s": tokens / seconds if seconds else 0.0, "tokens": tokens,
            "acceptance": sum(r["accepted"] for r in runs) / drafted if drafted else 0.0}


def family_files(small: bool) -> dict:
    from specdesk.app.demo.export_native_gguf import build_native
    from specdesk.app.demo.install import build_family

    family = build_family(small=small)
    return {**family, **build_native(family)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", default="draft,ngram,mtp,dflash,eagle3")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--ctx", type=int, default=512)
    parser.add_argument("--prompts", type=int, default=0, help="use the first N prompts (0: all)")
    parser.add_argument("--repeat", type=int, default=3,
                        help="runs per prompt and side; the fastest counts (other load on the machine only slows runs)")
    parser.add_argument("--small", action="store_true", help="the small test family instead of the shipped one")
    parser.add_argument("--jobs", type=int, default=2, help="parallel compile jobs for the one-time build")
    parser.add_argument("--build-server", action="store_true",
                        help="only build (once) and print the path of llama-server, which the served-engine tests use")
    args = parser.parse_args()

    if args.build_server:
        started = time.monotonic()
        binary = build_driver(args.jobs, SERVER)
        print(json.dumps({"llama_server": str(binary), "seconds": round(time.monotonic() - started, 1)}))
        return
    binary = build_driver(args.jobs)
    files = family_files(args.small)
    prompts = load_prompts(assets_dir() / "prompts" / "code.jsonl")
    prompts = prompts[:args.prompts] if args.prompts else prompts
    engines: dict[str, LlamaEngine] = {}
    for method in [m.strip() for m in args.methods.split(",") if m.strip()]:
        if method not in NATIVE_TYPES:
            sys.exit(f"error: unknown method {method!r}: choose from {', '.join(NATIVE_TYPES)}")
        target = files["mtp_gguf"] if method == "mtp" else files["target_gguf"]
        if target not in engines:
            engines[target] = LlamaEngine(target, n_ctx=args.ctx, n_threads=args.threads)
        engine = engines[target]
        native_runs, specdesk_runs = [], []
        for prompt in prompts:  # interleaved, so load changes on a shared machine hit both alike
            theirs, ours = [], []
            for _ in range(args.repeat):
                theirs.append(run_native(binary, method, files, prompt, args.k, args.max_tokens, args.threads, args.ctx))
                ours.append(run_specdesk(engine, method, files, prompt, args.k, args.max_tokens))
            native_runs.append(min(theirs, key=lambda r: r["seconds"]))
            specdesk_runs.append(min(ours, key=lambda r: r["seconds"]))
        ours, theirs = summarise(specdesk_runs), summarise(native_runs)
        print(json.dumps({
            "method": method, "native_type": NATIVE_TYPES[method], "k": args.k, "prompts": len(prompts),
            "specdesk_tok_s": round(ours["tok_s"], 2), "native_tok_s": round(theirs["tok_s"], 2),
            "ratio": round(ours["tok_s"] / theirs["tok_s"], 3) if theirs["tok_s"] else None,
            "specdesk_acceptance": round(ours["acceptance"], 3), "native_acceptance": round(theirs["acceptance"], 3),
            "specdesk_tokens": ours["tokens"], "native_tokens": theirs["tokens"], "threads": args.threads,
            "repeat": args.repeat,
            "family": "small" if args.small else "shipped",
            "drafter": files.get(f"{method}_source", "trained" if method == "draft" else "-"),
        }), flush=True)
    for engine in engines.values():
        engine.close()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
