"""Hugging Face checkpoint directories on disk: ``config.json``, the weights as one
``model.safetensors`` or as shards listed by ``model.safetensors.index.json``, and
``tokenizer.json``. Read and written with the ``safetensors`` library's NumPy API (no torch).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from attnlab import rundir
from attnlab.hf.families import HFError

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
TOKENIZER = "tokenizer.json"
READABLE_DTYPES = ("float32", "float16", "bfloat16")  # converted to float32, exactly


def read_config(directory: Path) -> dict[str, Any]:
    path = directory / CONFIG
    if not directory.exists():
        raise HFError(f"--from={directory}: no such directory (an HF checkpoint directory, "
                      f"holding {CONFIG} and {WEIGHTS})")
    if not directory.is_dir():
        raise HFError(f"--from={directory} is a file; give the checkpoint's directory")
    if not path.is_file():
        raise HFError(f"{path}: no such file (an HF checkpoint directory has a {CONFIG})")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise HFError(f"{path}: not a JSON file ({e})") from None
    if not isinstance(config, dict):
        raise HFError(f"{path}: not a JSON object")
    return config


class Weights:
    """The tensors of a checkpoint directory, by key: which file holds each, its shape, and
    (on :meth:`read`) its values as float32."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.files: dict[str, Path] = {}  # key -> file
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.stored: dict[str, str] = {}  # key as looked up -> key as stored in the file
        index = directory / INDEX
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise HFError(f"{index}: not a safetensors index (weight_map: {e})") from None
            shards = sorted(set(weight_map.values()))
        elif (directory / WEIGHTS).is_file():
            weight_map, shards = None, [WEIGHTS]
        else:
            raise HFError(f"{directory}: holds neither {WEIGHTS} nor {INDEX}")
        for shard in shards:
            path = directory / shard
            for key, shape in _header(path).items():
                self.files[key] = path
                self.shapes[key] = shape
        if weight_map is not None:
            for key, shard in weight_map.items():
                if self.files.get(key) != directory / shard:
                    raise HFError(f"{index}: {key} is listed in {shard}, which does not hold it")

    def rename(self, canonical) -> None:
        """Looks tensors up by ``canonical(key)`` from now on (a family's spelling of keys
        that other saves prefix differently); two keys with one spelling are refused."""
        files, shapes = {}, {}
        for key in self.files:
            name = canonical(key)
            if name in files:
                raise HFError(f"{self.files[key]}: tensors {key} and {self.stored[name]} are the "
                              "same parameter")
            files[name], shapes[name] = self.files[key], self.shapes[key]
            self.stored[name] = self.stored.get(key, key)
        self.files, self.shapes = files, shapes

    def read(self, key: str) -> np.ndarray:
        path = self.files[key]
        stored = self.stored.get(key, key)
        try:
            with safe_open(str(path), framework="numpy") as f:
                array = f.get_tensor(stored)
        except (SafetensorError, OSError, ValueError, TypeError) as e:
            raise HFError(f"{path}: cannot read tensor {key} ({e})") from None
        if array.dtype.name not in READABLE_DTYPES:
            raise HFError(f"{path}: tensor {key} is {array.dtype.name}; attnlab reads "
                          f"{', '.join(READABLE_DTYPES)}")
        return array.astype(np.float32)


def _header(path: Path) -> dict[str, tuple[int, ...]]:
    """``{key: shape}`` of a safetensors file, refusing a missing, truncated or corrupt one in
    one line naming it (safetensors checks that the header's offsets fit the file)."""
    if not path.is_file():
        raise HFError(f"{path}: no such file")
    try:
        with safe_open(str(path), framework="numpy") as f:
            return {key: tuple(f.get_slice(key).get_shape()) for key in f.keys()}
    except (SafetensorError, OSError, ValueError, TypeError) as e:
        raise HFError(f"{path}: not a readable safetensors file (truncated or corrupt: "
                      f"{str(e).splitlines()[0] if str(e) else type(e).__name__})") from None


def write_directory(directory: Path, config: dict[str, Any],
                    tensors: dict[str, np.ndarray], tokenizer: Path | None) -> None:
    """Writes ``config.json``, ``model.safetensors`` (and ``tokenizer.json``) into a fresh
    ``directory``: all of it into a temporary sibling first, renamed into place when complete,
    so a failure leaves nothing at ``directory``."""
    with staged(directory) as stage:
        (stage / CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        save_file(tensors, str(stage / WEIGHTS), metadata={"format": "pt"})
        if tokenizer is not None:
            shutil.copyfile(tokenizer, stage / TOKENIZER)


def check_target(target: Path) -> Path:
    """Refuses an output directory that exists and is not empty, or cannot be created; returns
    its parent (call it before any work, and :class:`staged` checks again)."""
    if target.exists() and not target.is_dir():
        raise HFError(f"{target} is a file; give a new directory")
    if target.exists() and any(target.iterdir()):
        raise HFError(f"{target} already exists and is not empty; give a new directory")
    parent = target.absolute().parent
    if not parent.is_dir():
        raise HFError(f"{target}: the directory {parent} does not exist")
    try:  # asked by trying: root passes os.access, /proc and read-only mounts refuse anyway
        rundir.check_can_create_dir(target, "the output directory")
    except rundir.WorkdirError as e:
        raise HFError(str(e)) from None
    return parent


class staged:
    """``with staged(target) as stage:`` a temporary directory next to ``target`` that is
    renamed to ``target`` when the block ends without an exception (and removed otherwise).
    ``target`` must not exist, or be an empty directory."""

    def __init__(self, target: Path):
        self.target = target

    def __enter__(self) -> Path:
        parent = check_target(self.target)
        self.stage = Path(tempfile.mkdtemp(prefix=f".{self.target.name}.", dir=parent))
        return self.stage

    def __exit__(self, kind, value, traceback) -> None:
        if kind is not None:
            shutil.rmtree(self.stage, ignore_errors=True)
            if isinstance(value, OSError) and (not value.filename
                                               or str(value.filename).startswith(str(self.stage))):
                # A full disk names the directory the user asked for, not the temporary one.
                raise OSError(value.errno, value.strerror, str(self.target)) from value
            return
        if self.target.exists():
            self.target.rmdir()  # empty (checked on entry)
        os.replace(self.stage, self.target)


def tokenizer_file(directory: Path) -> Path | None:
    """The directory's ``tokenizer.json``, if it has one."""
    path = directory / TOKENIZER
    return path if path.is_file() else None
