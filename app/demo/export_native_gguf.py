"""GGUF files for llama.cpp's native drafters of the demo family: an MTP-carrying target, a
DFlash drafter (and a DSpark one where the family has it) and an EAGLE-3 head, cached by a
fingerprint of their inputs (build_native). One file per exporter: native_gguf_mtp.py,
native_gguf_dflash.py, native_gguf_eagle3.py, their shared parts in native_gguf_common.py; their
names are importable from here as before.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Mapping, Optional

from specdesk.app.storage.paths import building
from specdesk.engines.types import SpecDeskError

from .native_gguf_common import read_config, read_weights
from .native_gguf_dflash import (DEFAULT_BLOCK_SIZE, DFLASH_ARCH, export_dflash, export_dflash_folder,  # noqa: F401
                                 initial_dflash_folder)
from .native_gguf_eagle3 import export_eagle3_folder, export_eagle3_seeded  # noqa: F401
from .native_gguf_mtp import (GGUF_BLOCK_TENSORS, MTP_ARCH, check_mtp_copy_source, export_mtp_target,  # noqa: F401
                              export_mtp_target_from_gguf, find_mtp_layer, initial_mtp_layer, mtp_copy_problems)

NATIVE_EXPORT_VERSION = 1


# --- the demo family's native files ------------------------------------------------------
def _digest(paths: list[Path], extra: str) -> str:
    h = hashlib.sha256(f"{NATIVE_EXPORT_VERSION}:{extra}".encode())
    for path in paths:
        files = sorted(p for p in Path(path).rglob("*") if p.is_file()) if Path(path).is_dir() else [Path(path)]
        for f in files:
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{int(st.st_mtime)}".encode())
    return h.hexdigest()[:16]


def build_native(family: Mapping[str, str], out_dir: Optional[Path] = None, seed: int = 0) -> dict[str, str]:
    """mtp_gguf, dflash_gguf and eagle3_gguf for a demo family (roles from build_family), and
    dspark_gguf where it has a DSpark drafter, cached under out_dir/<fingerprint of the inputs>.
    The DFlash drafter and the EAGLE-3 head are the family's `dflash_hf` and `eagle3_hf` folders
    when it has them, else seeded ones."""
    target_hf, target_gguf = Path(family["target_hf"]), Path(family["target_gguf"])
    dflash_hf = Path(family["dflash_hf"]) if family.get("dflash_hf") else None
    eagle3_hf = Path(family["eagle3_hf"]) if family.get("eagle3_hf") else None
    dspark_hf = Path(family["dspark_hf"]) if family.get("dspark_hf") else None
    inputs = [target_hf, target_gguf] + [p for p in (dflash_hf, eagle3_hf, dspark_hf) if p is not None]
    key = _digest(inputs, f"seed={seed}")
    out_dir = (Path(out_dir) if out_dir is not None else target_gguf.parent / "native") / key
    mtp_path = out_dir / "specdesk-demo-target-mtp-F16.gguf"
    dflash_path = out_dir / "specdesk-demo-dflash-F16.gguf"
    dspark_path = out_dir / "specdesk-demo-dspark-F16.gguf"
    with building(out_dir):
        if not mtp_path.is_file():
            export_mtp_target(target_hf, target_gguf, mtp_path, seed)
        unusable = dflash_problem(dflash_hf, target_hf) if dflash_hf is not None else "the family has no DFlash drafter"
        if not dflash_path.is_file():
            if not unusable:
                export_dflash_folder(dflash_hf, target_gguf, dflash_path)
            else:
                config, weights = initial_dflash_folder(target_hf, seed)
                export_dflash(config, weights, target_gguf, dflash_path, name="specdesk-demo-dflash-init")
        eagle3_path = out_dir / "specdesk-demo-eagle3-F16.gguf"
        if not eagle3_path.is_file():
            if eagle3_hf is not None:
                export_eagle3_folder(eagle3_hf, target_gguf, eagle3_path)
            else:
                export_eagle3_seeded(target_hf, target_gguf, eagle3_path, seed)
        has_dspark = dspark_hf is not None and not dflash_problem(dspark_hf, target_hf)
        if has_dspark and not dspark_path.is_file():
            export_dflash(read_config(dspark_hf), read_weights(dspark_hf), target_gguf, dspark_path,
                          name="specdesk-demo-dspark")
    native = {"mtp_gguf": str(mtp_path.resolve()), "dflash_gguf": str(dflash_path.resolve()),
              "eagle3_gguf": str(eagle3_path.resolve()),
              "mtp_source": "trained" if _has_mtp(target_hf) else "seeded (the checkpoint has no MTP layer)",
              "dflash_source": "trained" if not unusable else f"seeded ({unusable})",
              "eagle3_source": "trained" if eagle3_hf is not None else "seeded (the family has no trained EAGLE-3 head)"}
    if has_dspark:
        native["dspark_gguf"] = str(dspark_path.resolve())
    return native


def _has_mtp(target_hf: Path) -> bool:
    config = read_config(target_hf)
    return find_mtp_layer(read_weights(target_hf), config["num_hidden_layers"]) is not None


def dflash_problem(dflash_hf: Path, target_hf: Path) -> str:
    """Why llama.cpp cannot run this z-lab drafter on this target, or '' when it can.

    llama.cpp hands out the *inputs* of the target's layers, so the output of the last layer
    (target_layer_ids = num_hidden_layers - 1) is out of its reach."""
    config, target = read_config(dflash_hf), read_config(target_hf)
    ids = config.get("dflash_config", {}).get("target_layer_ids", config.get("target_layer_ids", []))
    n_layer = target["num_hidden_layers"]
    if any(int(i) + 1 >= n_layer for i in ids):
        return (f"the trained drafter reads layer outputs {list(ids)} of a {n_layer}-layer target; llama.cpp "
                f"can hand out layers 0..{n_layer - 2} only")
    return ""


if __name__ == "__main__":
    import argparse
    import sys

    parser = argparse.ArgumentParser(description="Export the demo family's MTP target and DFlash drafter as GGUF")
    parser.add_argument("--small", action="store_true", help="use the small test family")
    parser.add_argument("--out", type=Path, help="output folder")
    args = parser.parse_args()
    from .install import build_family

    try:
        print(json.dumps(build_native(build_family(small=args.small), args.out), indent=2))
    except SpecDeskError as e:
        sys.exit(f"error: {e}")
