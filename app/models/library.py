"""The model library: every model file SpecDesk can see on this machine, with its metadata.

Sources: the Hugging Face hub cache (huggingface_hub's own scan, so files are shared with
every HF tool), the demo family if it was built, folders or files the user added, and the
GGUF files other apps already downloaded (LM Studio, Ollama, Jan, GPT4All, llama.cpp's
cache; their locations per OS are kept in assets/model_sources.json). Files are always
read in place, never copied. Reading one model never stops the scan: a corrupt file is
listed with its error.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator, Optional

from specdesk.engines.files import require_regular_file
from specdesk.engines.methods import drafter_for_config, drafter_methods, drafter_settings, known, row

from ..storage.paths import assets_dir, cache_dir, hf_cache_dir
from .known import KNOWN

log = logging.getLogger(__name__)

GGUF_MAGIC = b"GGUF"
MAX_FOLDER_DEPTH = 5  # user folders are walked this deep, no deeper
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
# tokenizer.ggml.model -> the vocab type names llama.cpp reports (engines/llama/binding.py)
GGUF_VOCAB_TYPES = {"no_vocab": "none", "llama": "spm", "gpt2": "bpe", "bert": "wpm", "t5": "ugm",
                    "rwkv": "rwkv", "plamo2": "plamo2"}


@dataclass(frozen=True)
class Shape:
    """Dimensions that decide the KV cache and compute buffers (0 when unknown)."""

    n_layer: int = 0
    n_embd: int = 0
    n_ff: int = 0
    n_head: int = 0
    n_head_kv: int = 0
    key_length: int = 0
    value_length: int = 0


@dataclass(frozen=True)
class ModelEntry:
    path: str  # a GGUF file, or an HF checkpoint folder
    format: str  # "gguf" or "hf"
    source: str  # "hf-cache", "demo", "specdesk" (models fetch), "user", or an app name from assets/model_sources.json
    name: str
    architecture: Optional[str] = None
    parameters: Optional[int] = None
    quantization: Optional[str] = None
    context_length: Optional[int] = None
    vocab_type: Optional[str] = None
    vocab_size: Optional[int] = None
    chat_template: bool = False
    mtp_layers: int = 0  # MTP (nextn) layers in the file or config
    drafter: Optional[str] = None  # the method (engines/methods.py) when this model is itself a drafter checkpoint
    drafter_config: dict = field(default_factory=dict)  # the drafter's own settings (block size, layer ids)
    size_bytes: int = 0  # on disk
    weights_bytes: int = 0  # tensor data only (what llama.cpp maps)
    shape: Shape = field(default_factory=Shape)
    repo_id: Optional[str] = None  # hub repository, for files from the hub cache
    error: Optional[str] = None  # why the file could not be read; the other fields are then mostly empty

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict:
        data = asdict(self)
        data["shape"] = asdict(self.shape)
        return data


# --- GGUF ------------------------------------------------------------------------
def _whole(value) -> int:
    """A header value as a count: per-layer lists give their largest, anything else not a whole
    number gives 0 (the validation has already named it)."""
    if isinstance(value, list):
        value = max((v for v in value if isinstance(v, int)), default=0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _quantization(fields: dict, tensors: dict) -> Optional[str]:
    from gguf import LlamaFileType

    file_type = fields.get("general.file_type")
    if isinstance(file_type, int):
        try:
            return LlamaFileType(file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            pass
    counts: dict[str, int] = {}
    for t in tensors.values():
        counts[t.type_name] = counts.get(t.type_name, 0) + t.n_elements
    return max(counts, key=counts.get) if counts else None


def read_gguf(path: Path, source: str, name: Optional[str] = None, repo_id: Optional[str] = None) -> ModelEntry:
    """Metadata of one GGUF file, from its header only (bounded read; tensor data is never read).
    A file that parses but fails engines/llama/validate.py's checks keeps its metadata and
    gets `error` with every reason, so it is listed but never offered as usable."""
    from specdesk.engines.llama.fit import drafter_config as gguf_drafter_config
    from specdesk.engines.llama.header import read_gguf_header
    from specdesk.engines.llama.validate import describe_problems, gguf_problems

    path = Path(path)
    header = read_gguf_header(path)
    fields, arch = header.fields, header.architecture

    def meta(key: str, default=None):
        return fields.get(f"{arch}.{key}", default)

    n_head = _whole(meta("attention.head_count"))
    n_embd = _whole(meta("embedding_length"))
    head_dim = n_embd // n_head if n_head else 0
    shape = Shape(n_layer=_whole(meta("block_count")), n_embd=n_embd, n_ff=_whole(meta("feed_forward_length")),
                  n_head=n_head, n_head_kv=_whole(meta("attention.head_count_kv")) or n_head,
                  key_length=_whole(meta("attention.key_length")) or head_dim,
                  value_length=_whole(meta("attention.value_length")) or head_dim)
    tokenizer_model = fields.get("tokenizer.ggml.model")
    vocab_size = header.array_lengths.get("tokenizer.ggml.tokens") or _whole(meta("vocab_size")) or None
    drafter = arch if arch in drafter_methods() else None  # a drafter GGUF's architecture is its method
    drafter_config = gguf_drafter_config(arch, fields, header.tensors) if drafter else {}
    problems = gguf_problems(header)
    return ModelEntry(
        path=str(path), format="gguf", source=source,
        name=name or str(fields.get("general.name") or path.name),
        architecture=arch or None, parameters=sum(t.n_elements for t in header.tensor_infos.values()),
        quantization=_quantization(fields, header.tensor_infos),
        context_length=_whole(meta("context_length")) or None,
        vocab_type=GGUF_VOCAB_TYPES.get(str(tokenizer_model), str(tokenizer_model)) if tokenizer_model else None,
        vocab_size=vocab_size, chat_template=bool(fields.get("tokenizer.chat_template")),
        mtp_layers=_whole(meta("nextn_predict_layers")), drafter=drafter, drafter_config=drafter_config,
        size_bytes=header.size, weights_bytes=sum(t.n_bytes for t in header.tensor_infos.values()),
        shape=shape, repo_id=repo_id, error=describe_problems(path, problems) if problems else None,
    )


# --- HF checkpoint folders ----------------------------------------------------------
def _safetensors_parameters(path: Path) -> tuple[int, int]:
    """(parameters, tensor bytes) from a safetensors header, reading nothing else."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        if length > 100_000_000:
            raise ValueError(f"{path.name}: safetensors header of {length} bytes is not plausible")
        header = json.loads(f.read(length))
    parameters = nbytes = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        count = 1
        for dim in info["shape"]:
            count *= int(dim)
        parameters += count
        start, end = info["data_offsets"]
        nbytes += int(end) - int(start)
    return parameters, nbytes


def read_hf_folder(folder: Path, source: str, name: Optional[str] = None,
                   repo_id: Optional[str] = None) -> ModelEntry:
    """Metadata of a checkpoint folder from config.json and the safetensors headers. A config
    with bad keys (engines/hf_config.py), or a tokenizer.json the engine would refuse unread,
    keeps what could be read and gets `error` naming them."""
    from specdesk.engines.hf_config import config_problems, effective, read_config

    folder = Path(folder)
    config = read_config(folder / "config.json")
    problems = config_problems(config)

    def key(name: str, default=None):
        return effective(config, name, default)

    parameters = weights = size = 0
    for file in folder.iterdir():
        if not file.is_file():  # folders, and FIFOs or devices, which would block or never end
            continue
        size += file.stat().st_size
        if file.suffix == ".safetensors":
            p, b = _safetensors_parameters(file)
            parameters, weights = parameters + p, weights + b
    drafter = drafter_for_config(config)
    drafter_config = drafter_settings(drafter, config) if drafter else {}  # what its row keeps
    n_head = _whole(key("num_attention_heads", 0))
    n_embd = _whole(key("hidden_size", 0))
    head_dim = _whole(key("head_dim", 0)) or (n_embd // n_head if n_head else 0)
    tokenizer = folder / "tokenizer.json"
    architectures = config.get("architectures") if isinstance(config.get("architectures"), list) else []
    model_type = config.get("model_type") if isinstance(config.get("model_type"), str) else None
    dtype = key("torch_dtype") or key("dtype")
    return ModelEntry(
        path=str(folder), format="hf", source=source, name=name or folder.name,
        architecture=", ".join(str(a) for a in architectures) or model_type,
        parameters=parameters or None, quantization=str(dtype) if isinstance(dtype, str) and dtype else None,
        context_length=_whole(key("max_position_embeddings")) or None,
        vocab_type="tokenizer.json" if tokenizer.exists() else None, vocab_size=_whole(key("vocab_size")) or None,
        chat_template=(folder / "chat_template.jinja").exists() or _has_chat_template(folder),
        mtp_layers=_whole(key("num_nextn_predict_layers", 0)) or _whole(key("mtp_num_hidden_layers", 0)),
        drafter=drafter, drafter_config=drafter_config, size_bytes=size, weights_bytes=weights,
        shape=Shape(n_layer=_whole(key("num_hidden_layers", 0)), n_embd=n_embd,
                    n_ff=_whole(key("intermediate_size", 0)), n_head=n_head,
                    n_head_kv=_whole(key("num_key_value_heads")) or n_head, key_length=head_dim,
                    value_length=head_dim),
        repo_id=repo_id,
        error="; ".join(e for e in (f"{folder / 'config.json'}: {'; '.join(problems)}" if problems else None,
                                    tokenizer_problem(tokenizer)) if e) or None,
    )


def tokenizer_problem(path: Path) -> Optional[str]:
    """Why the PyTorch engine would refuse this tokenizer.json before reading it (not a regular
    file, or over its size limit), in its own words; None when it would not, or there is none.
    Only stat() is asked: a file of gigabytes is listed as quickly as any."""
    from specdesk.engines.hf_config import MAX_TOKENIZER_BYTES, sized_file
    from specdesk.engines.types import SpecDeskError

    if not os.path.lexists(path):
        return None
    try:
        sized_file(path, "tokenizer.json file", MAX_TOKENIZER_BYTES)
    except SpecDeskError as e:
        return str(e)
    return None


def _has_chat_template(folder: Path) -> bool:
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        return bool(config.get("chat_template"))
    except (OSError, ValueError, AttributeError):
        return False


# A config.json key marking a trained layer exported without its model (app/training/mtp.py,
# export_layer): weights and a config, but nothing that loads as a model, so not listed.
LAYER_ONLY = "specdesk_layer_only"


def is_hf_folder(folder: Path) -> bool:
    if not ((folder / "config.json").is_file() and any(
            p.suffix in WEIGHT_SUFFIXES for p in folder.iterdir() if p.is_file())):
        return False
    try:
        return json.loads((folder / "config.json").read_text(encoding="utf-8")).get(LAYER_ONLY) is not True
    except (OSError, ValueError, AttributeError):
        return True  # a damaged config is listed, with its error


def is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def read_model(path: str | os.PathLike, source: str = "user", name: Optional[str] = None,
               repo_id: Optional[str] = None) -> ModelEntry:
    """One model's entry; a file that cannot be read gets an entry with its error, never an exception."""
    p = Path(path)
    try:
        if p.is_dir():
            return read_hf_folder(p, source, name, repo_id)
        return read_gguf(require_regular_file(p, "GGUF model file"), source, name, repo_id)
    except Exception as e:  # noqa: BLE001 - any damage in one file is reported on its entry
        fmt = "hf" if p.is_dir() else "gguf"
        message = str(e) or type(e).__name__
        message = message.removeprefix(f"{p}: ")  # named once, below
        return ModelEntry(path=str(p), format=fmt, source=source, name=name or p.name, repo_id=repo_id,
                          size_bytes=p.stat().st_size if p.is_file() else 0,
                          error=f"{p}: cannot read this model ({message})")


# --- sources -------------------------------------------------------------------------
def scan_hf_cache(root: Optional[Path] = None) -> Iterator[ModelEntry]:
    """GGUF files and checkpoint folders in the hub cache, newest revision of each repository."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound

    root = Path(root) if root is not None else hf_cache_dir()
    try:
        info = scan_cache_dir(root)
    except CacheNotFound:
        return
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revision = max(repo.revisions, key=lambda r: (bool(r.refs), r.last_modified))
        files = sorted(revision.files, key=lambda f: str(f.file_path))
        for f in files:
            if f.file_name.endswith(".gguf"):
                rel = f.file_path.relative_to(revision.snapshot_path).as_posix()
                yield read_model(f.file_path, "hf-cache", f"{repo.repo_id}/{rel}", repo.repo_id)
        folders = {f.file_path.parent for f in files if f.file_name == "config.json"}
        for folder in sorted(folders):
            if is_hf_folder(folder):
                rel = folder.relative_to(revision.snapshot_path).as_posix()
                yield read_model(folder, "hf-cache", repo.repo_id + ("" if rel == "." else f"/{rel}"), repo.repo_id)


def demo_family_paths(root: Optional[Path] = None) -> list[Path]:
    """The demo family's GGUF files and HF folders that are already built (nothing is built here)."""
    from ..demo.install import MANIFEST, UNIT_PATHS

    root = Path(root) if root is not None else cache_dir() / "demo"
    found: list[Path] = []
    if not root.is_dir():
        return found
    for build in sorted(root.iterdir()):
        if not (build / MANIFEST).is_file():
            continue
        for unit, rel in UNIT_PATHS.items():
            # Models only (GGUF files, checkpoint folders); core-hf is the training input, not a model to run.
            if unit.endswith(("_gguf", "_hf")) and unit != "core_hf" and (build / rel).exists():
                found.append(build / rel)
    return found


def fetched_models(root: Optional[Path] = None) -> list[Path]:
    """The real models `specdesk models fetch` put in the cache's models/ folder (known.py), whole
    files only (a fetch writes `.partial` first and renames)."""
    root = Path(root) if root is not None else cache_dir() / "models"
    try:
        return sorted(p for p in root.glob("*.gguf") if p.is_file())
    except OSError:
        return []


def fetched_label(path: Path) -> Optional[str]:
    """A fetched real model's name as the project knows it ("SmolLM2 135M Instruct (Q4_1)"),
    not its file's general.name (SmolLM2's is a training run's, "Smollm2 135M 8k Lc100K Mix1 Ep2")."""
    return next((m.label for m in KNOWN.values() if m.filename == path.name), None)


def demo_name(path: Path) -> str:
    """A demo file's readable name: what it is and its family, from the build's card ("Demo
    target, small family"); the build folder's hash stays in the path."""
    import json

    from ..demo.install import UNIT_PATHS

    unit = next((u for u, rel in UNIT_PATHS.items() if Path(rel).name == path.name), "")
    what = unit.rsplit("_", 1)[0] if unit else path.name
    if known(what) and row(what).demo_drafter:  # a drafter the method picker offers as built in
        what = f"{row(what).short} drafter"
    try:
        family = json.loads((path.parent / UNIT_PATHS["card"]).read_text(encoding="utf-8")).get("family")
    except (OSError, ValueError, AttributeError):
        family = None
    return f"Demo {what}" + (f", {family} family" if isinstance(family, str) and family else "")


def walk_models(root: Path, max_depth: int = MAX_FOLDER_DEPTH) -> Iterator[Path]:
    """GGUF files and HF checkpoint folders under a folder (or the path itself)."""
    root = Path(root)
    if root.is_file():
        if root.suffix == ".gguf" or is_gguf(root):
            yield root
        return
    if not root.is_dir():
        if root.exists():  # a FIFO, socket or device named directly: listed with why it is refused
            yield root
        return
    if is_hf_folder(root):
        yield root
    try:
        children = sorted(root.iterdir())
    except OSError:
        return
    for child in children:
        if child.name.startswith("."):
            continue
        if child.is_file() and child.suffix == ".gguf":
            yield child
        elif child.is_dir() and max_depth > 0:
            yield from walk_models(child, max_depth - 1)


def platform_key() -> str:
    if sys.platform.startswith("win"):
        return "windows"
    if sys.platform == "darwin":
        return "macos"
    return "linux"


def load_sources(path: Optional[Path] = None) -> dict:
    """The table of other apps' model folders; empty (with a log line) when it is missing or broken,
    so a damaged install still lists the models it can."""
    path = Path(path) if path is not None else assets_dir() / "model_sources.json"
    return read_table(path, "sources", dict, "model sources") or {}


def read_table(path: Path, key: str, kind: type, what: str):
    """The `key` table of a JSON file when it is a `kind`, else None (with a log line when the
    file is missing or broken)."""
    try:
        table = json.loads(path.read_text(encoding="utf-8"))[key]
        if isinstance(table, kind):
            return table
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("%s: cannot read the %s table (%s)", path, what, e)
    return None


def expand_location(location: str, env: Optional[dict] = None) -> Optional[Path]:
    """`~`, $VAR, ${VAR} and %VAR% expanded from `env` (default: this process's environment);
    None when the location names a variable that is not set."""
    import re

    env = os.environ if env is None else env
    missing = False

    def value(match: re.Match) -> str:
        nonlocal missing
        name = next(g for g in match.groups() if g)
        if not env.get(name):
            missing = True
            return ""
        return env[name]

    location = re.sub(r"\$\{(\w+)\}|\$(\w+)|%(\w+)%", value, location)
    if missing:
        return None
    if location.startswith("~"):
        home = env.get("HOME") or env.get("USERPROFILE")
        location = (home + location[1:]) if home else os.path.expanduser(location)
    return Path(location)


def source_locations(name: str, sources: Optional[dict] = None, platform: Optional[str] = None,
                     env: Optional[dict] = None) -> list[Path]:
    sources = sources if sources is not None else load_sources()
    spec = sources[name]
    out: list[Path] = []
    for location in spec.get("paths", {}).get(platform or platform_key(), []):
        path = expand_location(location, env)
        if path is not None and path not in out:
            out.append(path)
    return out


def ollama_models(store: Path) -> Iterator[tuple[str, Path]]:
    """(name:tag, GGUF blob) for each manifest in an Ollama store; blobs are read in place."""
    manifests = store / "manifests"
    if not manifests.is_dir():
        return
    for manifest in sorted(p for p in manifests.rglob("*") if p.is_file()):
        parts = manifest.relative_to(manifests).parts  # registry / namespace / model / tag
        label = "/".join(parts[1:-1]) + f":{parts[-1]}" if len(parts) >= 3 else manifest.name
        if label.startswith("library/"):
            label = label[len("library/"):]
        try:
            layers = json.loads(manifest.read_text(encoding="utf-8")).get("layers", [])
        except (OSError, ValueError, AttributeError):
            continue
        for layer in layers:
            if layer.get("mediaType") == "application/vnd.ollama.image.model" and layer.get("digest"):
                yield label, store / "blobs" / layer["digest"].replace(":", "-")


def scan_app_source(name: str, spec: dict, roots: Iterable[Path]) -> Iterator[ModelEntry]:
    for root in roots:
        if not root.is_dir():
            continue
        if spec.get("layout") == "ollama":
            for label, blob in ollama_models(root):
                yield read_model(blob, name, f"{label} (Ollama)")
        else:
            for path in walk_models(root):
                if path.is_file():
                    yield read_model(path, name, path.relative_to(root).as_posix())


@dataclass
class LibraryConfig:
    """What to scan. Each app source can be switched off (settings.model_sources)."""

    hf_cache: Optional[Path] = None  # None: the standard location; use a missing folder to skip
    include_hf_cache: bool = True
    demo_root: Optional[Path] = None  # None: cache_dir()/demo
    include_demo: bool = True
    user_paths: list = field(default_factory=list)  # files or folders
    sources: dict = field(default_factory=dict)  # app name -> enabled (missing: enabled)
    include_apps: bool = True
    platform: Optional[str] = None
    env: Optional[dict] = None  # environment for app locations (tests give their own)
    sources_file: Optional[Path] = None

    @classmethod
    def from_settings(cls, settings) -> "LibraryConfig":
        return cls(user_paths=list(getattr(settings, "library_paths", []) or []),
                   sources=dict(getattr(settings, "model_sources", {}) or {}))


def scan_library(config: Optional[LibraryConfig] = None,
                 progress: Optional[Callable[[str], None]] = None) -> list[ModelEntry]:
    """Every model of every enabled source, each path once (the first source that finds it)."""
    config = config or LibraryConfig()
    say = progress or (lambda message: None)
    entries: list[ModelEntry] = []
    seen: set[str] = set()

    def add(batch: Iterable[ModelEntry]) -> None:
        for entry in batch:
            key = os.path.realpath(entry.path)
            if key not in seen:
                seen.add(key)
                entries.append(entry)

    if config.include_hf_cache:
        say("scanning the Hugging Face cache")
        add(scan_hf_cache(config.hf_cache))
    if config.include_demo:
        add(read_model(p, "demo", demo_name(p)) for p in demo_family_paths(config.demo_root))
        add(read_model(p, "specdesk", fetched_label(p)) for p in fetched_models())
    for user_path in config.user_paths:
        say(f"scanning {user_path}")
        add(read_model(p, "user") for p in walk_models(Path(user_path)))
    if config.include_apps:
        sources = load_sources(config.sources_file)
        for name, spec in sources.items():
            if not config.sources.get(name, True):
                continue
            roots = source_locations(name, sources, config.platform, config.env)
            say(f"scanning {spec.get('label', name)}")
            add(scan_app_source(name, spec, roots))
    return entries


def find_entry(entries: Iterable[ModelEntry], path: str | os.PathLike) -> Optional[ModelEntry]:
    key = os.path.realpath(path)
    return next((e for e in entries if os.path.realpath(e.path) == key), None)


def with_source(entry: ModelEntry, source: str) -> ModelEntry:
    return replace(entry, source=source)
