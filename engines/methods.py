"""The method table: every fact about a speculation method, in one place.

The CLI's `--method` choices, the app's pickers and their tooltips, serve's request checks,
the library's drafter detection and the proposer factory all read this table, so a new
method is one `MethodInfo` row here plus its proposer (docs/ARCHITECTURE.md, "Adding a method").
Order matters: it is the order of the CLI's choices and of the app's method picker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .errors import SpecDeskError

TAKES = ("none", "draft_model", "drafter_file")
ROLES = ("baseline", "chooser", "proposer")
ENGINES = frozenset({"llama.cpp", "torch"})  # the engines' `name`s


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
    short: str = ""  # a drafter's kind in prose: "DFlash", "EAGLE-3"
    needs: str = ""  # why a target cannot run it, when the engine gives no reason of its own
    proposer: Optional[tuple[str, str]] = None  # (module, class) in each engine's package, for model methods
    config_keys: tuple[str, ...] = ()  # config.json keys that mark a checkpoint as this method's drafter

    def __post_init__(self) -> None:
        if self.takes not in TAKES:
            raise ValueError(f"method {self.name!r}: takes must be one of {', '.join(TAKES)}")
        if self.role not in ROLES:
            raise ValueError(f"method {self.name!r}: role must be one of {', '.join(ROLES)}")
        if self.takes == "drafter_file" and not self.short:
            raise ValueError(f"method {self.name!r}: a drafter-file method needs its short name")

    @property
    def uses_file(self) -> bool:
        """The run is given the `--draft` file (a draft model or a drafter)."""
        return self.takes != "none"

    @property
    def drafter(self) -> str:
        """"a DFlash drafter", "an EAGLE-3 drafter": how messages name this method's file."""
        article = "an" if self.short[:1].upper() in "AEIOU" else "a"
        return f"{article} {self.short} drafter"


METHODS: dict[str, MethodInfo] = {m.name: m for m in (
    MethodInfo("none", "none (baseline)", "Plain decoding: one target pass per token. The compare view measures "
               "speculation against this.", role="baseline"),
    MethodInfo("auto", "auto (picks method and k)", "Each step, the method and k expected to be fastest on this "
               "machine (measured costs, running acceptance), or no speculation when nothing is; the status line "
               "says which and why.", takes="draft_model", role="chooser"),
    MethodInfo("ngram", "ngram (prompt lookup)", "Drafts by looking up the last few tokens earlier in the prompt "
               "and reply; needs no model."),
    MethodInfo("ngram-pool", "ngram-pool (learns per chat)", "An n-gram pool that learns from every turn of the "
               "chat; needs no model."),
    MethodInfo("draft", "draft model", "A smaller model with the same vocabulary drafts k tokens; the target "
               "checks them in one pass.", takes="draft_model", file_required=True,
               proposer=("draft", "DraftProposer")),
    MethodInfo("crossvocab", "draft model, any vocabulary", "A smaller model with a tokenizer of its own drafts; "
               "its text is re-tokenized for the target, which checks it in one pass (greedy: the target's own "
               "output; sampling: it drafts only the tokens both vocabularies share, so it stays lossless).",
               takes="draft_model", file_required=True, short="cross-vocabulary draft",
               proposer=("crossvocab", "CrossVocabProposer")),
    MethodInfo("mtp", "MTP heads", "The target's own multi-token-prediction layers draft k tokens from its "
               "hidden state.", reads_hidden=True, short="MTP",
               needs="needs a model with multi-token-prediction (MTP) layers", proposer=("mtp", "MtpProposer")),
    MethodInfo("dflash", "DFlash block drafter", "A DFlash drafter proposes a whole block in one pass from the "
               "target's hidden states (a DSpark drafter is one too, with a Markov head).", takes="drafter_file",
               file_required=True, reads_hidden=True,
               short="DFlash", needs="needs a DFlash block drafter made for this target",
               proposer=("dflash", "DFlashProposer"), config_keys=("dflash_config", "markov_rank")),
    MethodInfo("eagle3", "EAGLE-3", "An EAGLE-3 head drafts from three of the target's hidden layers.",
               takes="drafter_file", file_required=True, reads_hidden=True, short="EAGLE-3",
               needs="needs an EAGLE-3 drafter made for this target", proposer=("eagle3", "Eagle3Proposer"),
               config_keys=("eagle_config", "draft_vocab_size")),
)}


def method_info(name: str) -> MethodInfo:
    """The row of a method, or the project's error naming the known ones."""
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise SpecDeskError(f"unknown method {name!r}: choose one of {', '.join(METHODS)}") from None


def method_names(engine: Optional[str] = None) -> tuple[str, ...]:
    """Every method in table order, or those the named engine runs."""
    return tuple(name for name, info in METHODS.items() if engine is None or engine in info.engines)


def proposing_methods() -> tuple[str, ...]:
    """The methods that draft tokens themselves: those auto may choose among."""
    return tuple(name for name, info in METHODS.items() if info.role == "proposer")


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
