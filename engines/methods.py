"""The method table: every fact about a speculation method, in one place.

The CLI's `--method` choices, the app's pickers and their tooltips, serve's request checks,
the library's drafter detection, both engines' `load_native` and availability checks, the
proposer factory, auto's candidates, the charts' colours and the trainer (`specdesk
train-drafter` and its dialog) all read this table, so a new method is one `MethodInfo` row
here plus its own files: its proposer, and what its row names (docs/ARCHITECTURE.md, "Adding a
method"). Order matters: it is the order of the CLI's choices and of the app's method picker.

Code a row names is written `(module, attribute)` and imported on first use (`resolve`), so this
table imports no engine and no app code: an engine that never runs a method never imports its
files, and the layers stay ui -> app -> engines.
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping, Optional

from .errors import SpecDeskError

TAKES = ("none", "draft_model", "drafter_file")
ROLES = ("baseline", "chooser", "proposer")
ENGINES = frozenset({"llama.cpp", "torch"})  # the engines' `name`s
ENGINE_PACKAGES = {"llama.cpp": "llama", "torch": "torch"}  # engine name -> its package under engines/

Ref = tuple[str, str]  # (module, attribute), imported on first use by `resolve`


def in_engines(module: str, attribute: str, engines=ENGINES) -> dict[str, Ref]:
    """engine -> (module, attribute) for the same module name in each engine's package:
    in_engines("mtp", "MtpProposer") names engines/llama/mtp.py's and engines/torch/mtp.py's."""
    return {engine: (f"{__package__}.{ENGINE_PACKAGES[engine]}.{module}", attribute) for engine in sorted(engines)}


def resolve(ref: Ref) -> Any:
    """What a row names: the attribute (dotted for a nested one) of a module imported now."""
    module, attribute = ref
    found: Any = importlib.import_module(module)
    for part in attribute.split("."):
        found = getattr(found, part)
    return found


@dataclass(frozen=True)
class Training:
    """What `specdesk train-drafter` (app/training/) and its dialog ask about a method they train.
    The refs are (module, attribute) in the method's own training files."""

    label: str  # the trainer's prose: "an EAGLE-3 head"
    choice: str  # the train dialog's item: "EAGLE-3 head"
    taps: Ref  # (network) -> the target layers a recording keeps for it
    plan: Ref  # (app.training.methods.PlanInputs) -> its Plan: the module trained, a step, evaluate, export
    export_gguf: Ref  # (folder, target_gguf, path, from_gguf) -> the GGUF that the llama.cpp engine loads
    refuse: Optional[Ref] = None  # (target, from_gguf) -> None: refuses a target before anything loads
    check: Optional[Ref] = None  # (the target's config, draft_layers) -> None: refuses before recording
    rank: int = 0  # its place in the trainer's choices (CLI and dialog); the lowest is the default


@dataclass(frozen=True)
class MethodInfo:
    name: str  # as typed on the command line and stored in settings and measurements
    label: str  # the app's picker
    help: str  # the picker's tooltip
    takes: str = "none"  # the file `--draft` names: none, a draft model, or a drafter made for one target
    file_required: bool = False  # False: the file is used when given (auto may pick the draft model)
    reads_hidden: bool = False  # drafts from the target's hidden states
    engines: frozenset = ENGINES  # which engines run it
    role: str = "proposer"  # baseline (no speculation), chooser (picks among the others), proposer
    short: str = ""  # its kind in prose: "DFlash", "EAGLE-3", "n-gram"
    needs: str = ""  # why a target cannot run it, when the engine gives no reason of its own
    # --- how it drafts ---
    shared: Optional[Ref] = None  # a method that needs no model: (engine, spec) -> its proposer, on any engine
    proposer: Mapping[str, Ref] = field(default_factory=dict)  # engine -> its proposer class, for model methods
    native: Mapping[str, Ref] = field(default_factory=dict)  # engine -> (engine, path) -> its model (load_native)
    problem: Mapping[str, Ref] = field(default_factory=dict)  # engine -> why a target cannot run it (each engine's own signature)
    learns: bool = False  # its proposer learns across the turns of a chat (it lives as long as the engine)
    # --- its files ---
    config_keys: tuple[str, ...] = ()  # config.json keys that mark a checkpoint as this method's drafter
    config_section: str = ""  # config.json's section of its drafter settings (keys at the top level join them)
    config_fields: tuple[str, ...] = ()  # the drafter settings the library keeps from a config.json
    symbols: tuple[str, ...] = ()  # the llama-ext.h functions its llama.cpp drafter calls (engines/llama/ext.py)
    gguf_width_key: str = "embedding_length"  # a drafter GGUF's key for the hidden size of its target
    gguf_target_layers: Optional[int] = None  # how many target layers its drafter GGUF must read (None: any)
    gguf_fc_checked: bool = False  # its fc layer's input width must be those layers x hidden
    in_target: bool = False  # its layers live inside the target's own file (MTP), not in a drafter file
    demo_drafter: str = ""  # the settings value naming the demo family's drafter for it (app/storage/settings.py)
    # --- auto, charts, training ---
    auto: bool = False  # among auto's candidates unless a request names its own (in table order)
    rival: bool = False  # a trained drafter is measured against it before it is adopted (app/training/adopt.py)
    color: Optional[tuple[int, int, int]] = None  # its colour in the charts (RGB)
    training: Optional[Training] = None  # how `specdesk train-drafter` trains it
    variant_of: str = ""  # a variant runs as that method (DSpark: a DFlash drafter with a Markov head)
    files: tuple[str, ...] = ()  # its own files beyond those named after it (repository paths)

    def __post_init__(self) -> None:
        if self.takes not in TAKES:
            raise ValueError(f"method {self.name!r}: takes must be one of {', '.join(TAKES)}")
        if self.role not in ROLES:
            raise ValueError(f"method {self.name!r}: role must be one of {', '.join(ROLES)}")
        if self.takes == "drafter_file" and not self.short:
            raise ValueError(f"method {self.name!r}: a drafter-file method needs its short name")
        if (self.proposer or self.native) and self.shared:
            raise ValueError(f"method {self.name!r}: a shared proposer needs no model: give it no engine proposer")

    @property
    def uses_file(self) -> bool:
        """The run is given the `--draft` file (a draft model or a drafter)."""
        return self.takes != "none"

    @property
    def drafter(self) -> str:
        """"a DFlash drafter", "an EAGLE-3 drafter": how messages name this method's file."""
        article = "an" if self.short[:1].upper() in "AEIOU" else "a"
        return f"{article} {self.short} drafter"

    @property
    def lookup(self) -> bool:
        """It drafts by looking tokens up, not with a model: drafting costs next to nothing."""
        return self.role == "proposer" and self.takes == "none" and not self.reads_hidden and not self.in_target

    @property
    def runs_as(self) -> str:
        """The method the engines run its drafter as: its own name, or a variant's base."""
        return self.variant_of or self.name


TRAINING = "specdesk.app.training"  # the trainer's package: the training facts' refs name its modules
LAYER_INPUTS = ("llama_set_embeddings_layer_inp", "llama_get_embeddings_layer_inp", "llama_set_embeddings_nextn",
                "llama_model_target_layer_ids", "llama_model_target_layer_ids_n")  # what a layer-input drafter calls

METHODS: dict[str, MethodInfo] = {m.name: m for m in (
    MethodInfo("none", "none (baseline)", "Plain decoding: one target pass per token. The compare view measures "
               "speculation against this.", role="baseline", color=(150, 150, 150)),
    MethodInfo("auto", "auto (picks method and k)", "Each step, the method and k expected to be fastest on this "
               "machine (measured costs, running acceptance), or no speculation when nothing is; the status line "
               "says which and why.", takes="draft_model", role="chooser"),
    MethodInfo("ngram", "ngram (prompt lookup)", "Drafts by looking up the last few tokens earlier in the prompt "
               "and reply; needs no model.", short="n-gram", shared=(f"{__package__}.speculation.ngram", "lookup"),
               auto=True, rival=True, color=(66, 133, 244)),
    MethodInfo("ngram-pool", "ngram-pool (learns per chat)", "An n-gram pool that learns from every turn of the "
               "chat; needs no model.", short="n-gram pool", shared=(f"{__package__}.speculation.ngram", "pool"),
               learns=True, auto=True, color=(67, 160, 71), files=("engines/speculation/ngram.py",)),
    MethodInfo("draft", "draft model", "A smaller model with the same vocabulary drafts k tokens; the target "
               "checks them in one pass.", takes="draft_model", file_required=True, short="draft model",
               proposer=in_engines("draft", "DraftProposer"), auto=True, rival=True, color=(245, 124, 0),
               training=Training("a draft model", "Draft model (a smaller copy, distilled)",
                                 taps=(f"{TRAINING}.draft", "plan_taps"), plan=(f"{TRAINING}.draft", "plan"),
                                 export_gguf=(f"{TRAINING}.draft", "export_gguf"),
                                 check=(f"{TRAINING}.draft", "check"), rank=4)),
    MethodInfo("crossvocab", "draft model, any vocabulary", "A smaller model with a tokenizer of its own drafts; "
               "its text is re-tokenized for the target, which checks it in one pass (greedy: the target's own "
               "output; sampling: it drafts only the tokens both vocabularies share, so it stays lossless).",
               takes="draft_model", file_required=True, short="cross-vocabulary draft",
               proposer=in_engines("crossvocab", "CrossVocabProposer")),
    MethodInfo("mtp", "MTP heads", "The target's own multi-token-prediction layers draft k tokens from its "
               "hidden state.", reads_hidden=True, short="MTP",
               needs="needs a model with multi-token-prediction (MTP) layers",
               proposer=in_engines("mtp", "MtpProposer"), native=in_engines("mtp", "load_native"),
               problem=in_engines("mtp", "native_problem"), in_target=True,
               symbols=("llama_set_embeddings_nextn", "llama_get_embeddings_nextn", "llama_get_embeddings_nextn_ith"),
               auto=True, rival=True, color=(142, 68, 173), files=("app/demo/native_gguf_mtp.py",),
               training=Training("an MTP layer", "MTP layer", taps=(f"{TRAINING}.mtp", "plan_taps"),
                                 plan=(f"{TRAINING}.mtp", "plan"), export_gguf=(f"{TRAINING}.mtp", "export_gguf"),
                                 refuse=(f"{TRAINING}.mtp", "refuse_target"), rank=1)),
    MethodInfo("dflash", "DFlash block drafter", "A DFlash drafter proposes a whole block in one pass from the "
               "target's hidden states (a DSpark drafter is one too, with a Markov head).", takes="drafter_file",
               file_required=True, reads_hidden=True,
               short="DFlash", needs="needs a DFlash block drafter made for this target",
               proposer=in_engines("dflash", "DFlashProposer"), native=in_engines("dflash", "load_native"),
               problem={"torch": (f"{__package__}.torch.dflash", "native_problem")},
               config_keys=("dflash_config", "markov_rank"), config_section="dflash_config",
               config_fields=("block_size", "num_target_layers", "mask_token_id", "target_layer_ids", "markov_rank"),
               symbols=LAYER_INPUTS + ("llama_model_dflash_selector_top_k",), gguf_fc_checked=True,
               demo_drafter="demo-dflash", color=(0, 172, 193), files=("app/demo/native_gguf_dflash.py",),
               training=Training("a DFlash drafter", "DFlash block drafter", taps=(f"{TRAINING}.dflash", "plan_taps"),
                                 plan=(f"{TRAINING}.dflash", "plan"),
                                 export_gguf=(f"{TRAINING}.dflash", "export_gguf"),
                                 check=(f"{TRAINING}.dflash", "check"), rank=2)),
    MethodInfo("eagle3", "EAGLE-3", "An EAGLE-3 head drafts from three of the target's hidden layers.",
               takes="drafter_file", file_required=True, reads_hidden=True, short="EAGLE-3",
               needs="needs an EAGLE-3 drafter made for this target", proposer=in_engines("eagle3", "Eagle3Proposer"),
               native=in_engines("eagle3", "load_native"),
               problem={"torch": (f"{__package__}.torch.eagle3", "native_problem")},
               config_keys=("eagle_config", "draft_vocab_size"),
               config_fields=("draft_vocab_size", "eagle_aux_hidden_state_layer_ids", "eagle_config"),
               symbols=LAYER_INPUTS[:3] + ("llama_get_embeddings_nextn",) + LAYER_INPUTS[3:],
               gguf_width_key="target_hidden_size", gguf_target_layers=3, color=(229, 57, 53),
               files=("app/demo/native_gguf_eagle3.py",),
               training=Training("an EAGLE-3 head", "EAGLE-3 head", taps=(f"{TRAINING}.eagle3", "plan_taps"),
                                 plan=(f"{TRAINING}.eagle3", "plan"),
                                 export_gguf=(f"{TRAINING}.eagle3", "export_gguf"), rank=0)),
)}

# Variants: rows that train, export and detect as a method of their own but run as another's
# drafter, so they are in no picker and no `--method` of a run.
VARIANTS: dict[str, MethodInfo] = {m.name: m for m in (
    MethodInfo("dspark", "DSpark block drafter", "A DFlash drafter with a Markov head (DeepSeek's DeepSpec): it "
               "runs as dflash.", takes="drafter_file", file_required=True, reads_hidden=True, short="DSpark",
               variant_of="dflash",
               training=Training("a DSpark drafter", "DSpark block drafter (DFlash with a Markov head)",
                                 taps=(f"{TRAINING}.dflash", "plan_taps"), plan=(f"{TRAINING}.dspark", "plan"),
                                 export_gguf=(f"{TRAINING}.dflash", "export_gguf"),
                                 check=(f"{TRAINING}.dflash", "check"), rank=3)),
)}


@contextmanager
def registered(info: MethodInfo) -> Iterator[MethodInfo]:
    """A row added to the table for as long as the block runs (a test's own method), then taken
    out again: everything that reads the table sees it meanwhile."""
    table = VARIANTS if info.variant_of else METHODS
    if info.name in METHODS or info.name in VARIANTS:
        raise ValueError(f"method {info.name!r} is in the table already")
    table[info.name] = info
    try:
        yield info
    finally:
        table.pop(info.name, None)


def method_info(name: str) -> MethodInfo:
    """The row of a method, or the project's error naming the known ones."""
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise SpecDeskError(f"unknown method {name!r}: choose one of {', '.join(METHODS)}") from None


def row(name: str) -> MethodInfo:
    """The row of a method or of a variant (what the trainer and the demo name)."""
    found = VARIANTS.get(name) if isinstance(name, str) else None
    return found or method_info(name)


def known(name) -> bool:
    """A method or variant of the table (names from files and the hub may be anything)."""
    return isinstance(name, str) and (name in METHODS or name in VARIANTS)


def all_rows() -> tuple[MethodInfo, ...]:
    """Every row, each variant after the method it runs as."""
    return tuple(info for base in METHODS.values()
                 for info in (base, *(v for v in VARIANTS.values() if v.variant_of == base.name)))


def method_names(engine: Optional[str] = None) -> tuple[str, ...]:
    """Every method in table order, or those the named engine runs."""
    return tuple(name for name, info in METHODS.items() if engine is None or engine in info.engines)


def proposing_methods() -> tuple[str, ...]:
    """The methods that draft tokens themselves: those auto may choose among."""
    return tuple(name for name, info in METHODS.items() if info.role == "proposer")


def auto_methods() -> tuple[str, ...]:
    """Auto's candidates unless a request names its own, in the order its ties are broken in."""
    return tuple(name for name, info in METHODS.items() if info.auto)


def lookup_methods() -> tuple[str, ...]:
    """The methods that draft by looking tokens up: their drafting costs next to nothing, so
    only the target's passes decide whether they pay."""
    return tuple(name for name, info in METHODS.items() if info.lookup)


def in_target_method() -> str:
    """The method whose layers live inside the target's own file (MTP)."""
    return next(name for name, info in METHODS.items() if info.in_target)


def is_in_target(name) -> bool:
    return known(name) and row(name).in_target


def rivals() -> tuple[str, ...]:
    """What a trained drafter is measured against before it is adopted, in table order."""
    return tuple(name for name, info in METHODS.items() if info.rival)


def trainable() -> tuple[str, ...]:
    """What `specdesk train-drafter` trains (methods and variants), in its order; the first is its default."""
    return tuple(info.name for info in sorted((i for i in all_rows() if i.training), key=lambda i: i.training.rank))


def training(name: str) -> Training:
    """A trainable method's training facts, or the project's error naming those it trains."""
    found = row(name).training if known(name) else None
    if found is None:
        raise SpecDeskError(f"the trainer trains no {name!r}: choose one of {', '.join(trainable())}")
    return found


def runs_as(name: str) -> str:
    """The method that runs a drafter of this method or variant (a DSpark drafter runs as dflash)."""
    return row(name).runs_as


def native_drafters() -> tuple[str, ...]:
    """Methods and variants whose drafters read the target's hidden states (MTP, DFlash, ...)."""
    return tuple(info.name for info in all_rows() if info.reads_hidden)


def demo_drafter_method(value) -> Optional[str]:
    """The method whose demo drafter a settings value names (settings.DEMO_DFLASH), else None."""
    return next((name for name, info in METHODS.items() if info.demo_drafter and info.demo_drafter == value), None)


def own_files(name: str) -> tuple[str, ...]:
    """The files a row names as its own, beyond those named after it."""
    return row(name).files


def method_color(name: str) -> Optional[tuple[int, int, int]]:
    info = METHODS.get(name) or VARIANTS.get(name)
    return info.color if info is not None else None


def takes_drafter_file(name: str) -> bool:
    """A drafter made for one target (a DFlash or EAGLE-3 file), not a general draft model."""
    return method_info(name).takes == "drafter_file"


def needs_draft_model(name: str) -> bool:
    """The method cannot run without a draft model."""
    info = method_info(name)
    return info.takes == "draft_model" and info.file_required


def uses_file(name: str) -> bool:
    """The method is given the `--draft` file when there is one."""
    return method_info(name).uses_file


def drafter_methods() -> tuple[str, ...]:
    """The methods whose file is a drafter made for one target; a drafter GGUF's
    `general.architecture` is its method's name."""
    return tuple(name for name, info in METHODS.items() if info.takes == "drafter_file")


def drafter_for_config(config: dict) -> Optional[str]:
    """The drafter method a checkpoint's config.json is made for (its architectures name the
    method, or it carries the method's config keys), else None."""
    names = config.get("architectures")
    architectures = " ".join(str(a) for a in names).lower() if isinstance(names, list) else ""
    for name in drafter_methods():
        if name in architectures or any(key in config for key in METHODS[name].config_keys):
            return name
    return None


def drafter_settings(method: str, config: dict) -> dict:
    """The drafter settings the library keeps from a checkpoint's config.json: its row's section
    (z-lab DFlash's dflash_config), with its fields at the top level (DeepSpec DSpark's) over them."""
    info = method_info(method)
    section = config.get(info.config_section) if info.config_section else None
    return {**(section if isinstance(section, dict) else {}),
            **{key: config[key] for key in info.config_fields if key in config}}
