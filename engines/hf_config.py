"""Checks of a Hugging Face config.json before anything is sized from it.

A model is built from its config before its weights are read, so a config that claims 10^9
layers or a vocabulary of 10^12 would allocate without end, and a `hidden_size` of "abc" or a
zero head count would end in a traceback. `config_problems` names each bad key in one line;
the PyTorch engine refuses a config with any, and the library lists the folder with them.
No torch here: the library reads configs without it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from .files import require_regular_file
from .types import SpecDeskError

MAX_CONFIG_BYTES = 16 * 1024 * 1024  # real configs are a few KB
# tokenizer.json is parsed twice (by the PyTorch engine and by the tokenizers library), each taking
# several times its size. The largest real one we know is Gemma 3's, 33 MB (262,144 tokens,
# indented); Gemma 2's is 17.5 MB, Llama 3's 9 MB, Qwen 2.5's 7 MB, and llama.cpp's vocabulary
# files are at most 16 MB. Twice Gemma 3's admits a larger vocabulary yet and refuses, before
# anything reads it, a file whose parse would take gigabytes. The library applies it too.
MAX_TOKENIZER_BYTES = 64 * 2**20
# key -> (smallest, largest): far above any released model, far below what would exhaust memory
INT_LIMITS = {
    "num_hidden_layers": (1, 1024),
    "vocab_size": (1, 1 << 22),
    "hidden_size": (1, 1 << 16),
    "intermediate_size": (1, 1 << 20),
    "num_attention_heads": (1, 1024),
    "num_key_value_heads": (1, 1024),
    "head_dim": (1, 4096),
    "max_position_embeddings": (1, 1 << 24),
    "num_nextn_predict_layers": (0, 64),
    "mtp_num_hidden_layers": (0, 64),
}
POSITIVE_FLOATS = ("rms_norm_eps", "rope_theta")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def sized_file(path: str | os.PathLike, what: str, max_bytes: int) -> Path:
    """`path` when it is a regular file of at most max_bytes (from stat: nothing is read), else
    a one-line SpecDeskError naming the file."""
    p = require_regular_file(path, what)
    size = p.stat().st_size
    if size > max_bytes:
        raise SpecDeskError(f"{p}: {size} bytes is not a plausible {what} (the limit is {max_bytes})")
    return p


def read_config(path: str | os.PathLike, what: str = "config.json file", max_bytes: int = MAX_CONFIG_BYTES) -> dict:
    """A JSON config file (config.json, an index) as a dict: a regular file, of at most
    max_bytes (checked before it is read), nested within Python's limits, an object; else a
    one-line SpecDeskError naming the file."""
    p = sized_file(path, what, max_bytes)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise SpecDeskError(f"{p}: cannot read it ({e})") from None
    except RecursionError:
        raise SpecDeskError(f"{p}: JSON nested too deeply to read") from None
    if not isinstance(data, dict):
        raise SpecDeskError(f"{p}: expected a JSON object")
    return data


def effective(config: dict, key: str, default: Any = None) -> Any:
    """A key of the config, or of its text_config (multimodal checkpoints keep them there)."""
    text = config.get("text_config")
    if key in config:
        return config[key]
    return text.get(key, default) if isinstance(text, dict) else default


def config_problems(config: dict) -> list[str]:
    """Every bad key of a config.json (empty: none), each as 'KEY is VALUE; expected ...'.
    Missing keys are not problems here: which are needed depends on the reader."""
    problems: list[str] = []
    if "text_config" in config and not isinstance(config["text_config"], dict):
        problems.append(f"text_config is {config['text_config']!r}; expected an object")
    architectures = config.get("architectures")
    if architectures is not None and not (isinstance(architectures, list)
                                          and all(isinstance(a, str) for a in architectures)):
        problems.append(f"architectures is {architectures!r}; expected a list of names")
    if "model_type" in config and not isinstance(config["model_type"], str):
        problems.append(f"model_type is {config['model_type']!r}; expected a name")
    for key, (low, high) in INT_LIMITS.items():
        value = effective(config, key)
        if value is not None and (not _is_int(value) or not low <= value <= high):
            problems.append(f"{key} is {value!r}; expected a whole number from {low} to {high}")
    for key in POSITIVE_FLOATS:
        value = effective(config, key)
        if value is not None and not (isinstance(value, (int, float)) and not isinstance(value, bool)
                                      and math.isfinite(value) and value > 0):
            problems.append(f"{key} is {value!r}; expected a positive number")
    if problems:
        return problems  # the relations below assume well-typed values
    heads, kv_heads = effective(config, "num_attention_heads"), effective(config, "num_key_value_heads")
    hidden, head_dim = effective(config, "hidden_size"), effective(config, "head_dim")
    if heads and kv_heads and heads % kv_heads:
        problems.append(f"num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}")
    if heads and hidden and head_dim is None and hidden % heads:
        problems.append(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads} (and no head_dim is given)")
    rope_scaling = effective(config, "rope_scaling")
    if rope_scaling is not None:
        if not isinstance(rope_scaling, dict):
            problems.append(f"rope_scaling is {rope_scaling!r}; expected an object like "
                            '{"rope_type": "llama3", "factor": 8.0, ...} or null')
        else:
            kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
            factor = rope_scaling.get("factor")
            if kind is not None and not isinstance(kind, str):
                problems.append(f"rope_scaling.rope_type is {kind!r}; expected a name")
            if factor is not None and not (isinstance(factor, (int, float)) and not isinstance(factor, bool)
                                           and math.isfinite(factor) and factor > 0):
                problems.append(f"rope_scaling.factor is {factor!r}; expected a positive number")
    return problems


def check_config(config: dict, source: str | Path) -> dict:
    """The config, or a one-line SpecDeskError naming `source` (the config.json path) and every bad key."""
    problems = config_problems(config)
    if problems:
        raise SpecDeskError(f"{source}: {'; '.join(problems)}")
    return config
