"""Where prepared data lives, and writing it atomically.

Layout under the cache root (``data.cache_dir``, else ``$ATTNLAB_DATA_DIR``, else
``$XDG_CACHE_HOME/attnlab`` or ``~/.cache/attnlab``)::

    tfds/<builder>/<config>/<version>/          TFDS array_record files + dataset_info.json
    prepared/<builder>/<config>/<version>/[<feature>/]<tokenizer>/
        manifest.json  train.npy  validation.npy  test.npy  [tokenizer.json]
    locks/                                      one lock file per prepared directory
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import tempfile
from pathlib import Path
from typing import Iterator

from attnlab.data.errors import CacheError

ENV_VAR = "ATTNLAB_DATA_DIR"


def cache_root(cache_dir: str = "") -> Path:
    """The cache root: the config value, else $ATTNLAB_DATA_DIR, else the user's cache dir."""
    if cache_dir:
        root = Path(cache_dir)
    elif os.environ.get(ENV_VAR):
        root = Path(os.environ[ENV_VAR])
    else:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        root = Path(base) / "attnlab"
    root = root.expanduser()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise CacheError(f"data.cache_dir: cannot create {str(root)!r}: {e.strerror or e}") from e
    if not os.access(root, os.W_OK):
        raise CacheError(f"data.cache_dir: {str(root)!r} is not writable")
    return root


@contextlib.contextmanager
def build_lock(root: Path, key: Path) -> Iterator[None]:
    """Serialises builds of one directory across processes (e.g. a sweep starting N runs)."""
    locks = root / "locks"
    locks.mkdir(exist_ok=True)
    name = hashlib.sha256(str(key).encode()).hexdigest()[:16] + ".lock"
    with open(locks / name, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yields a fresh temporary directory next to ``final``; renames it to ``final`` on success
    and deletes it on any error, so ``final`` is either complete or absent. Called under
    :func:`build_lock` for ``final``: a temporary of a build killed before it could delete its
    own (SIGKILL) is no one's, and is removed first."""
    for stale in final.parent.glob(f".{final.name}.incomplete-*"):
        shutil.rmtree(stale, ignore_errors=True)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.incomplete-", dir=final.parent))
        tmp.chmod(0o755)
    except OSError as e:
        raise CacheError(f"cannot write to the cache at {str(final.parent)!r}: {e}") from e
    try:
        yield tmp
        os.rename(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
