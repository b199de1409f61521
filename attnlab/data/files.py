"""Text files on disk: listing them, splitting them by a hash of their path, and slicing by size.

The split of a file depends only on its path relative to the corpus root, so a file never moves
between splits when other files are added, removed or edited, and no file is in two splits.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import os
import sysconfig
from pathlib import Path

from attnlab.data.errors import DataSourceError

SPLITS = ("train", "validation", "test")
# Percent of the hash buckets (and, under a size limit, of the byte budget) per split.
SPLIT_PERCENT = {"train": 90, "validation": 5, "test": 5}
SPLIT_RULE = (
    "bucket = first 8 bytes of sha256(relative path) as a big-endian integer mod 100; "
    "buckets 0-89 train, 90-94 validation, 95-99 test"
)


@dataclasses.dataclass(frozen=True)
class SourceFile:
    relpath: str  # POSIX path relative to the corpus root; decides the split
    path: str  # absolute path
    size: int  # bytes


def path_digest(relpath: str) -> bytes:
    return hashlib.sha256(relpath.encode("utf-8", "surrogateescape")).digest()


def split_of(relpath: str) -> str:
    """The split a file belongs to, a pure function of its relative path (see SPLIT_RULE)."""
    return split_of_digest(path_digest(relpath))


def split_of_digest(digest: bytes) -> str:
    """The split of a SHA-256 ``digest``: the bucket of SPLIT_RULE."""
    bucket = int.from_bytes(digest[:8], "big") % 100
    if bucket < SPLIT_PERCENT["train"]:
        return "train"
    if bucket < SPLIT_PERCENT["train"] + SPLIT_PERCENT["validation"]:
        return "validation"
    return "test"


def stdlib_root() -> Path:
    """The standard library of the running interpreter (the base install, not a virtualenv)."""
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def stdlib_files() -> tuple[Path, list[SourceFile]]:
    """Every non-empty ``.py`` file of the standard library, third-party packages excluded.

    Returns:
      (root, files sorted by relative path)
    """
    root = stdlib_root()
    files = []
    for dirpath, dirnames, filenames in os.walk(root):
        # site-packages / dist-packages hold third-party code, not the standard library.
        dirnames[:] = sorted(
            d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__")
        )
        for name in filenames:
            if name.endswith(".py"):
                files.append(_source_file(root, Path(dirpath) / name))
    return root, _sorted_non_empty(files)


def text_files(pattern: str) -> tuple[Path, list[SourceFile]]:
    """The files named by ``data.path``: a directory (walked recursively) or a glob.

    Hidden files and directories (names starting with '.') are skipped when walking a directory.

    Returns:
      (root that relative paths are taken from, non-empty files sorted by relative path)

    Raises:
      DataSourceError: the directory does not exist, or nothing non-empty matches.
    """
    if glob.has_magic(pattern):
        root = _glob_root(pattern)
        matches = [Path(p) for p in glob.glob(os.path.expanduser(pattern), recursive=True)]
        paths = [p for p in matches if p.is_file()]
        if not paths:
            raise DataSourceError(f"data.path: no file matches the glob {pattern!r}")
    else:
        root = Path(pattern).expanduser()
        if not root.exists():
            raise DataSourceError(f"data.path: {str(root)!r} does not exist")
        if root.is_file():
            raise DataSourceError(
                f"data.path: {str(root)!r} is a single file; a corpus needs files for train, "
                "validation and test, so give a directory or a glob"
            )
        paths = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            paths.extend(Path(dirpath) / n for n in filenames if not n.startswith("."))
        if not paths:
            raise DataSourceError(f"data.path: directory {str(root)!r} is empty")
    # abspath, not resolve: a symlinked file keeps its place (and split) under the root.
    root = Path(os.path.abspath(root))
    files = _sorted_non_empty(_source_file(root, Path(os.path.abspath(p))) for p in paths)
    if not files:
        raise DataSourceError(f"data.path: every file under {pattern!r} is empty")
    return root, files


def select_splits(files: list[SourceFile], max_bytes: int) -> dict[str, list[SourceFile]]:
    """Assigns files to splits; with ``max_bytes > 0`` keeps a deterministic slice of that size.

    The slice gives each split its share of the budget (90/5/5 %) and fills it with that split's
    files in hash order, skipping files that no longer fit, so a slice is a pseudo-random sample of
    the corpus and every split gets files even when the budget is small.

    Returns:
      {split: files sorted by relative path}
    """
    by_split: dict[str, list[SourceFile]] = {s: [] for s in SPLITS}
    for f in sorted(files, key=lambda f: path_digest(f.relpath)):
        by_split[split_of(f.relpath)].append(f)
    if max_bytes > 0:
        for split in SPLITS:
            budget = max_bytes * SPLIT_PERCENT[split] // 100
            kept, used = [], 0
            for f in by_split[split]:
                if used + f.size <= budget:
                    kept.append(f)
                    used += f.size
            by_split[split] = kept
    return {s: sorted(fs, key=lambda f: f.relpath) for s, fs in by_split.items()}


def fingerprint(root: Path, files: list[SourceFile], *extra: object) -> str:
    """A short hash of the listing (paths, sizes, modification times): edited files -> new cache."""
    h = hashlib.sha256(str(root).encode("utf-8", "surrogateescape"))
    for item in extra:
        h.update(repr(item).encode())
    for f in files:
        mtime = os.stat(f.path).st_mtime_ns
        h.update(f"{f.relpath}\0{f.size}\0{mtime}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()[:12]


def read_file(f: SourceFile) -> bytes:
    try:
        return Path(f.path).read_bytes()
    except OSError as e:
        raise DataSourceError(f"cannot read {f.path!r}: {e.strerror or e}") from e


def _source_file(root: Path, path: Path) -> SourceFile:
    try:
        size = path.stat().st_size
    except OSError as e:
        raise DataSourceError(f"cannot read {str(path)!r}: {e.strerror or e}") from e
    return SourceFile(relpath=path.relative_to(root).as_posix(), path=str(path), size=size)


def _sorted_non_empty(files) -> list[SourceFile]:
    # An empty file is an empty document: it would add only a separator.
    return sorted((f for f in files if f.size > 0), key=lambda f: f.relpath)


def _glob_root(pattern: str) -> Path:
    """The longest leading directory of a glob without wildcards (relative paths start there)."""
    parts = Path(os.path.expanduser(pattern)).parts
    fixed = []
    for part in parts:
        if glob.has_magic(part):
            break
        fixed.append(part)
    return Path(*fixed) if fixed else Path(".")
