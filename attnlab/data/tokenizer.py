"""Tokenizers: bytes (the default) and a byte-level BPE trained locally with HF `tokenizers`.

Both map any byte string to ids and back exactly (bytes -> ids -> bytes is the identity).
The end-of-document separator is the byte 0x00, which is checked at build time never to occur in
a corpus, so no extra id is needed: the byte tokenizer keeps vocab 256 with eos_id = 0, and the
BPE keeps 0x00 as a token of its own (it is never seen in training, so never merged).
No id is reserved for padding.

[MASK] (the masked objectives) is not a token of either tokenizer: it is the model's
last id, past the tokenizer's vocabulary (byte: 256 with ``model.vocab_size=257``). Prompts write it
as the text ``[MASK]``: :func:`encode_with_masks` / :func:`decode_with_masks`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable, Protocol

import numpy as np
import tokenizers
from tokenizers import Regex, models, pre_tokenizers, trainers

from attnlab.data.errors import DataError
from attnlab.errors import ConfigError

EOS_BYTE = 0


TOKENIZER_FILE = "tokenizer.json"  # a trained or given tokenizer, beside a prepared corpus


class Tokenizer(Protocol):
    name: str
    vocab_size: int
    eos_id: int

    def encode(self, data: bytes | str) -> np.ndarray: ...

    def decode(self, ids) -> bytes: ...


def _as_bytes(data: bytes | str) -> bytes:
    return data.encode("utf-8") if isinstance(data, str) else bytes(data)


class ByteTokenizer:
    """id = byte value. vocab 256, eos_id 0."""

    name = "byte"
    vocab_size = 256
    eos_id = EOS_BYTE

    def encode(self, data: bytes | str) -> np.ndarray:
        """bytes (str is UTF-8 encoded) -> [len] int32."""
        return np.frombuffer(_as_bytes(data), np.uint8).astype(np.int32)

    def decode(self, ids) -> bytes:
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= 256):
            raise DataError(f"byte tokenizer: ids must be in 0..255, got {ids.min()}..{ids.max()}")
        return ids.astype(np.uint8).tobytes()

    def encode_documents(self, documents: list[bytes]) -> list[np.ndarray]:
        return [np.frombuffer(d, np.uint8) for d in documents]

    def describe(self) -> dict:
        return {"name": self.name, "vocab_size": self.vocab_size, "eos_id": self.eos_id}

    # What a corpus of the data section ``d`` needs to know before it is built.
    trained = False  # learns nothing from the corpus, so any source may read it as it goes
    one_id_per_byte = True

    @classmethod
    def check(cls, d) -> None:
        """The data section's fields this tokenizer reads."""

    @classmethod
    def ids(cls, d) -> int:
        return cls.vocab_size

    @classmethod
    def separator(cls, d) -> int:
        return cls.eos_id

    @classmethod
    def key(cls, d) -> str:
        """Names the prepared corpora this tokenizer wrote (a directory under the cache)."""
        return cls.name

    @classmethod
    def for_corpus(cls, train_documents: list[bytes], d) -> ByteTokenizer:
        return cls()

    @classmethod
    def stored(cls, directory: Path, separator: int) -> ByteTokenizer:
        """The tokenizer of the prepared corpus in ``directory`` (:data:`STORED`)."""
        return cls()


MASK_TEXT = "[MASK]"


def encode_with_masks(tokenizer: Tokenizer, text: bytes | str, mask_id: int) -> np.ndarray:
    """Encodes ``text`` with every ``[MASK]`` as the id ``mask_id`` (which must lie past the
    tokenizer's vocabulary); the text between masks is encoded as usual. ``[len] int32``."""
    if mask_id < tokenizer.vocab_size:
        raise DataError(f"[MASK] id {mask_id} is inside the {tokenizer.name} tokenizer's "
                        f"vocabulary (0..{tokenizer.vocab_size - 1})")
    pieces = _as_bytes(text).split(MASK_TEXT.encode())
    out: list[np.ndarray] = []
    for i, piece in enumerate(pieces):
        if i:
            out.append(np.array([mask_id], np.int32))
        out.append(np.asarray(tokenizer.encode(piece), np.int32))
    return np.concatenate(out)


def decode_with_masks(tokenizer: Tokenizer, ids, mask_id: int) -> bytes:
    """Decodes ``ids``, writing each ``mask_id`` as ``[MASK]``."""
    ids = np.asarray(ids)
    out, run = [], []
    for i in ids.tolist():
        if i == mask_id:
            out.append(tokenizer.decode(np.asarray(run, np.int32)) + MASK_TEXT.encode())
            run = []
        else:
            run.append(i)
    return b"".join(out) + tokenizer.decode(np.asarray(run, np.int32))


def byte_alphabet() -> list[str]:
    """256 printable characters standing for the 256 bytes, as in GPT-2's byte-level BPE
    (Radford et al. 2019): printable Latin-1 bytes stand for themselves, the others (controls,
    space, DEL, NBSP, soft hyphen) are shifted to U+0100 and up, in byte order."""
    printable = (
        set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAD)) | set(range(0xAE, 0x100))
    )
    out, shifted = [], 0
    for byte in range(256):
        if byte in printable:
            out.append(chr(byte))
        else:
            out.append(chr(0x100 + shifted))
            shifted += 1
    return out


_ALPHABET = byte_alphabet()
_TO_ALPHABET = {byte: char for byte, char in enumerate(_ALPHABET)}
_FROM_ALPHABET = {char: byte for byte, char in enumerate(_ALPHABET)}
# Character classes of the byte stand-ins: whitespace and control bytes (0x00-0x20) map to
# U+0100-U+0120; bytes >= 0x7F to Latin-1 letters or U+0121-U+0143.
_SPACE = _ALPHABET[ord(" ")]
_BLANK = "\u0100-\u0120"
_HIGH = "\u00a1-\u00ff\u0121-\u0143"
# GPT-2's pre-tokenization rule (contractions, words, numbers, punctuation each with an
# optional leading space, whitespace runs) written over the byte stand-ins, so that it splits
# raw bytes, valid UTF-8 or not. Non-ASCII bytes count as letters, keeping UTF-8 words whole.
_PRETOKEN_PATTERN = (
    r"'(?:s|t|re|ve|m|ll|d)"
    rf"|{_SPACE}?[A-Za-z{_HIGH}]+"
    rf"|{_SPACE}?[0-9]+"
    rf"|{_SPACE}?[^{_BLANK}A-Za-z0-9{_HIGH}]+"
    rf"|[{_BLANK}]+(?![^{_BLANK}])"
    rf"|[{_BLANK}]+"
)


def _to_alphabet(data: bytes) -> str:
    return data.decode("latin-1").translate(_TO_ALPHABET)


class BpeTokenizer:
    """Byte-level BPE. Its input is bytes written in the 256-character stand-in alphabet, so it
    never needs an unknown token and decoding (via the alphabet, not HF's UTF-8 decoder) is exact
    for any bytes."""

    def __init__(self, hf_tokenizer: tokenizers.Tokenizer, path: str | None = None):
        self._hf = hf_tokenizer
        self.path = path
        vocab = hf_tokenizer.get_vocab()
        self.vocab_size = hf_tokenizer.get_vocab_size()
        self.eos_id = vocab[_ALPHABET[EOS_BYTE]]
        self.name = f"bpe{self.vocab_size}"
        self._id_bytes = [b""] * self.vocab_size
        for token, i in vocab.items():
            self._id_bytes[i] = bytes(_FROM_ALPHABET[c] for c in token)

    name = "bpe"  # an instance's name also says its size (bpe512)
    trained = True  # on the corpus's training split, held in memory
    one_id_per_byte = False

    @classmethod
    def check(cls, d) -> None:
        if d.bpe_vocab_size <= 256:
            raise ConfigError("data.bpe_vocab_size",
                              f"must exceed the 256 byte tokens, got {d.bpe_vocab_size}")

    @classmethod
    def ids(cls, d) -> int:
        return d.bpe_vocab_size

    @classmethod
    def separator(cls, d) -> int:
        return bpe_separator_id()

    @classmethod
    def key(cls, d) -> str:
        return f"{cls.name}{d.bpe_vocab_size}"

    @classmethod
    def for_corpus(cls, train_documents: list[bytes], d) -> BpeTokenizer:
        return cls.train(train_documents, d.bpe_vocab_size)

    @classmethod
    def train(cls, documents: Iterable[bytes], vocab_size: int) -> BpeTokenizer:
        """Learns merges on ``documents`` (the training split) up to ``vocab_size`` ids (more
        than the 256 bytes: ``check``)."""
        hf = tokenizers.Tokenizer(models.BPE())
        hf.pre_tokenizer = pre_tokenizers.Split(Regex(_PRETOKEN_PATTERN), behavior="isolated")
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, initial_alphabet=_ALPHABET, show_progress=False
        )
        hf.train_from_iterator((_to_alphabet(d) for d in documents), trainer=trainer)
        return cls(hf)

    @classmethod
    def load(cls, path: str | Path) -> BpeTokenizer:
        return cls(tokenizers.Tokenizer.from_file(str(path)), str(path))

    @classmethod
    def stored(cls, directory: Path, separator: int) -> BpeTokenizer:
        return cls.load(directory / TOKENIZER_FILE)

    def save(self, path: str | Path) -> None:
        self._hf.save(str(path))

    def encode(self, data: bytes | str) -> np.ndarray:
        """bytes (str is UTF-8 encoded) -> [n_tokens] int32."""
        return np.asarray(self._hf.encode(_to_alphabet(_as_bytes(data))).ids, np.int32)

    def encode_documents(self, documents: list[bytes], chunk: int = 256) -> list[np.ndarray]:
        out = []
        for start in range(0, len(documents), chunk):
            texts = [_to_alphabet(d) for d in documents[start : start + chunk]]
            out.extend(np.asarray(e.ids, np.int32) for e in self._hf.encode_batch_fast(texts))
        return out

    def decode(self, ids) -> bytes:
        ids = np.asarray(ids)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise DataError(
                f"{self.name}: ids must be in 0..{self.vocab_size - 1}, "
                f"got {ids.min()}..{ids.max()}"
            )
        return b"".join(map(self._id_bytes.__getitem__, ids.tolist()))

    def describe(self) -> dict:
        out = {"name": self.name, "vocab_size": self.vocab_size, "eos_id": self.eos_id}
        if self.path:
            out["file"] = self.path
            out["sha256"] = hashlib.sha256(Path(self.path).read_bytes()).hexdigest()
        return out


def id_space(hf: tokenizers.Tokenizer) -> int:
    """How many ids a model's table needs for ``hf``: its largest id + 1. A tokenizer.json's ids
    need not be contiguous, so its count (``get_vocab_size``) can be smaller."""
    ids = hf.get_vocab(with_added_tokens=True).values()
    return max(hf.get_vocab_size(), max(ids, default=-1) + 1)


class HubTokenizer:
    """A Hugging Face ``tokenizer.json`` as it came with an imported checkpoint (``attnlab
    import-hf``): text is encoded as that model was trained on it (no special tokens added),
    ids are decoded to UTF-8 text. Not byte-exact for every input, unlike the two above: that is
    the imported model's own tokenizer."""

    kind = "tokenizer.json"  # what a prepared corpus's manifest records
    one_id_per_byte = False

    def __init__(self, path: str | Path, eos_id: int = -1):
        self.path = str(path)
        try:
            self._hf = tokenizers.Tokenizer.from_file(self.path)
        except Exception as e:  # noqa: BLE001 - tokenizers raises its own exception types
            raise DataError(f"{path}: not a readable tokenizer.json ({e})") from None
        self.vocab_size = id_space(self._hf)
        self.name = f"hf{self.vocab_size}"
        self.eos_id = eos_id  # -1: unknown (an imported checkpoint's tokenizer)

    @classmethod
    def stored(cls, directory: Path, separator: int) -> HubTokenizer:
        return cls(directory / TOKENIZER_FILE, separator)

    def encode(self, data: bytes | str) -> np.ndarray:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        return np.asarray(self._hf.encode(text, add_special_tokens=False).ids, np.int32)

    def decode(self, ids) -> bytes:
        ids = [i for i in np.asarray(ids).tolist() if 0 <= i < self.vocab_size]
        return self._hf.decode(ids, skip_special_tokens=False).encode("utf-8")


def bpe_separator_id() -> int:
    """The trained BPE's id of the byte 0x00, known before it is trained: its alphabet's
    characters take the first ids in code-point order, and 0x00 is never merged."""
    return sorted(_ALPHABET).index(_ALPHABET[EOS_BYTE])


TOKENIZERS = {cls.name: cls for cls in (ByteTokenizer, BpeTokenizer)}
# A prepared corpus's tokenizer, by the kind its manifest records.
STORED = {**TOKENIZERS, HubTokenizer.kind: HubTokenizer}


def stored_tokenizer(record: dict, directory: Path, separator: int) -> Tokenizer:
    """The tokenizer of the prepared corpus in ``directory`` from its manifest's ``record``:
    shards record their ``kind``; a TFDS build names the class (byte, bpe512)."""
    kind = record.get("kind") or record["name"].rstrip("0123456789")
    return STORED[kind].stored(directory, separator)


def is_tokenizer_file(name: str) -> bool:
    """``data.tokenizer`` names a tokenizer.json file rather than one of TOKENIZERS."""
    return name.endswith(".json")


def tokenizer_class(name: str) -> type[ByteTokenizer] | type[BpeTokenizer] | None:
    """The tokenizer ``data.tokenizer`` names; None for the path of a tokenizer.json (which
    the sources that read one check). Raises ConfigError("data.tokenizer") for any other."""
    if is_tokenizer_file(name):
        return None
    if name not in TOKENIZERS:
        raise ConfigError("data.tokenizer", f"unknown value {name!r}; valid values are "
                          f"{', '.join(TOKENIZERS)}, or the path of a tokenizer.json")
    return TOKENIZERS[name]
