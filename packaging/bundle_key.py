"""The key of what a bundle is built from, for scripts/bundle_check.sh.

A sha256 over the files that decide the bundle (everything under packaging/, pyproject.toml,
the selftest and the check script itself) and over the installed distributions and
interpreter: when none of them changed since the last successful check, building the
bundle again would prove nothing new.

    python packaging/bundle_key.py          # prints the key
"""

from __future__ import annotations

import hashlib
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INPUTS = ("packaging", "pyproject.toml", "ui/selftest.py", "ui/cli.py", "scripts/bundle_check.sh")


def input_files(root: Path = ROOT) -> list[Path]:
    """Tracked and untracked (not ignored) files of INPUTS; every file when not in a git checkout."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", *INPUTS],
                                cwd=root, capture_output=True, check=True).stdout
        names = {name for name in listed.decode().split("\0") if name}
    except (OSError, subprocess.CalledProcessError):
        names = set()
        for item in INPUTS:
            path = root / item
            names |= {p.relative_to(root).as_posix() for p in ([path] if path.is_file() else path.rglob("*"))
                      if p.is_file() and "__pycache__" not in p.parts}
    return [root / name for name in sorted(names) if (root / name).is_file()]


def environment() -> list[str]:
    """The interpreter and every installed distribution, as name==version lines."""
    dists = sorted({f"{d.metadata['Name']}=={d.version}".lower() for d in metadata.distributions()
                    if d.metadata["Name"]})
    return [f"python {platform.python_version()} {platform.machine()} {sys.platform}", *dists]


def bundle_key(root: Path = ROOT) -> str:
    digest = hashlib.sha256()
    for path in input_files(root):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    for line in environment():
        digest.update(line.encode() + b"\n")
    return digest.hexdigest()


if __name__ == "__main__":
    print(bundle_key())
