"""Opening user-named files safely: only regular files are read as models or prompts.

A FIFO, socket or device named as a model would block `open()` forever (a FIFO waits for a
writer) or stream without end (/dev/zero), so the file's type is checked with stat() first,
which never blocks.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .types import SpecDeskError

_KINDS = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def cache_dir() -> Path:
    """The folder for files derived from the user's (a draft's Q8_0 copy, the CPU modules'
    verdicts, measured costs): SPECDESK_CACHE_DIR, else the user's cache folder."""
    import platformdirs

    override = os.environ.get("SPECDESK_CACHE_DIR")
    return Path(override) if override else Path(platformdirs.user_cache_dir("specdesk"))


def special_kind(mode: int) -> str:
    """What a non-regular file is, in words ('a FIFO (named pipe)', 'a folder', ...)."""
    if stat.S_ISDIR(mode):
        return "a folder"
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def require_regular_file(path: str | os.PathLike, what: str) -> Path:
    """`path` if it names a regular file (symbolic links followed), else a one-line
    SpecDeskError naming the path and what it is; `what` says what was expected
    ('GGUF model file', 'prompts file')."""
    p = Path(path)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        raise SpecDeskError(f"{p}: no such file (expected a {what}; check the path)") from None
    except OSError as e:
        raise SpecDeskError(f"{p}: cannot read it ({e.strerror or e}); expected a {what}") from None
    if not stat.S_ISREG(mode):
        hint = " (choose the file inside it)" if stat.S_ISDIR(mode) else ""
        raise SpecDeskError(f"{p}: is {special_kind(mode)}, not a regular file: choose a {what}{hint}")
    return p
