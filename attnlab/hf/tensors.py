"""How one Hugging Face tensor holds attnlab parameters: :class:`Tensor` (its key, the attnlab
parameter paths and a :class:`Layout`), one small class per layout.

Every map is a copy, transpose, concatenation or reshape: exact in both directions (OPT's two
unreachable position rows aside). Shapes: attnlab kernels are ``[in, out]``, PyTorch
``nn.Linear`` weights ``[out, in]``.
"""

from __future__ import annotations

import dataclasses

import numpy as np

POSITION_OFFSET = 2  # OPT reads row p + 2 of its position table for position p


class Layout:
    """One way of storing parameters in an HF tensor (immutable)."""

    def hf_shape(self, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
        """The HF tensor's shape, from its parameters' shapes."""
        return tuple(shapes[0])

    def to_hf(self, params: tuple[np.ndarray, ...]) -> np.ndarray:
        return np.ascontiguousarray(params[0])

    def from_hf(self, tensor: np.ndarray, count: int) -> tuple[np.ndarray, ...]:
        """The ``count`` parameters ``tensor`` holds."""
        return (np.ascontiguousarray(tensor),)


@dataclasses.dataclass(frozen=True)
class Same(Layout):
    """One parameter, stored as it is."""


@dataclasses.dataclass(frozen=True)
class Transposed(Layout):
    """One attnlab kernel ``[in, out]`` as a PyTorch ``nn.Linear`` weight ``[out, in]``."""

    def hf_shape(self, shapes):
        return (*shapes[0][:-2], shapes[0][-1], shapes[0][-2])

    def to_hf(self, params):
        return np.ascontiguousarray(np.swapaxes(params[0], -1, -2))

    def from_hf(self, tensor, count):
        return (np.ascontiguousarray(np.swapaxes(tensor, -1, -2)),)


@dataclasses.dataclass(frozen=True)
class SideBySide(Layout):
    """Several parameters concatenated along the last axis (GPT-2's ``c_attn``: q, k, v weights
    ``[d, 3d]``, biases ``[3d]``)."""

    def hf_shape(self, shapes):
        return (*shapes[0][:-1], sum(s[-1] for s in shapes))

    def to_hf(self, params):
        return np.concatenate(params, axis=-1)

    def from_hf(self, tensor, count):
        return tuple(np.ascontiguousarray(p) for p in np.split(tensor, count, axis=-1))


@dataclasses.dataclass(frozen=True)
class OffsetRows(Layout):
    """A table whose first :data:`POSITION_OFFSET` rows no position reaches (OPT's): dropped on
    import, zeros on export."""

    def hf_shape(self, shapes):
        return (shapes[0][0] + POSITION_OFFSET, *shapes[0][1:])

    def to_hf(self, params):
        table = params[0]
        return np.concatenate([np.zeros((POSITION_OFFSET, *table.shape[1:]), table.dtype),
                               table])

    def from_hf(self, tensor, count):
        return (np.ascontiguousarray(tensor[POSITION_OFFSET:]),)


@dataclasses.dataclass(frozen=True)
class PerHead(Layout):
    """q, k, v interleaved head by head (Bloom's ``query_key_value``: output rows
    ``[heads, 3, head_dim]``), PyTorch weights ``[3 d, d]`` or biases ``[3 d]``."""

    heads: int

    def hf_shape(self, shapes):
        outputs = sum(s[-1] for s in shapes)
        return (outputs, shapes[0][0]) if len(shapes[0]) == 2 else (outputs,)

    def to_hf(self, params):
        # [in, h hd] kernels or [h hd] biases -> [h, 3, hd(, in)]
        rows = [np.swapaxes(p, -1, -2) if p.ndim == 2 else p for p in params]
        rows = [r.reshape(self.heads, -1, *r.shape[1:]) for r in rows]
        stacked = np.stack(rows, axis=1)
        return np.ascontiguousarray(stacked.reshape(-1, *stacked.shape[3:]))

    def from_hf(self, tensor, count):
        parts = tensor.reshape(self.heads, count, -1, *tensor.shape[1:])
        out = [parts[:, i].reshape(-1, *tensor.shape[1:]) for i in range(count)]
        return tuple(np.ascontiguousarray(np.swapaxes(o, -1, -2) if o.ndim == 2 else o)
                     for o in out)


SAME, TRANSPOSED, SIDE_BY_SIDE, OFFSET_ROWS = Same(), Transposed(), SideBySide(), OffsetRows()


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One HF tensor: its key, the attnlab parameter paths it holds, and how (``layout``)."""

    key: str
    paths: tuple[str, ...]
    layout: Layout = SAME

    def hf_shape(self, shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
        """The HF tensor's shape, from its parameters' shapes."""
        return self.layout.hf_shape(shapes)

    def to_hf(self, *params: np.ndarray) -> np.ndarray:
        return self.layout.to_hf(params)

    def from_hf(self, tensor: np.ndarray) -> tuple[np.ndarray, ...]:
        return self.layout.from_hf(tensor, len(self.paths))


def one(key: str, path: str, transposed: bool = False) -> Tensor:
    """One parameter as one HF tensor (a PyTorch weight when ``transposed``)."""
    return Tensor(key, (path,), TRANSPOSED if transposed else SAME)


def side_by_side(key: str, paths: tuple[str, ...]) -> Tensor:
    return Tensor(key, paths, SIDE_BY_SIDE)
