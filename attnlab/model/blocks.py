"""Block kinds: how a layer wires its sequence mixer and FFN with norms and residuals, one class
per kind (``model.norm_position``; nGPT's block is in ``ngpt.py``), and the helpers that run a
stack of layers (rematerialised, or stacked for a scan).

    pre-LN:  x = x + Mixer(Norm(x));  x = x + FFN(Norm(x))          (the stack ends with a norm)
    post-LN: x = Norm(x + Mixer(x));  x = Norm(x + FFN(x))          (Vaswani et al. 2017)

Every block module takes ``(x [batch, seq, d_model], positions [pbatch, seq], *, bias, documents,
state, start, dropout_key) -> (x, state)``: ``bias`` the layer's score bias, ``documents`` each
token's document span (:class:`~attnlab.model.masks.Documents`, or None), ``state`` the mixer's
decode state (None in training). Dropout (``model.dropout``) acts on both residual branches.

Adding a block kind is one subclass of :class:`BlockKind` (its module beside it) and one line in
``architecture.BLOCKS``.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from attnlab.config import ModelConfig, TrainConfig
from attnlab.model.ffn import FFN
from attnlab.model.layers import REMAT_POLICIES, dropout
from attnlab.model.mixers import SequenceMixer


@dataclasses.dataclass(frozen=True)
class BlockKind:
    """Layer ``mixer.layer`` of a model built from ``cfg``: its mixer, FFN and norm class
    (immutable, hashable). The model-wide hooks (final norm, head scale, parameter constraint)
    are the same for every layer of a stack.

    Class attributes: ``name`` (the ``model.norm_position`` value); ``title`` (for messages);
    ``final_norm``: the stack ends with a norm; ``pre_norm``: each sublayer reads ``Norm(x)``
    and adds to the residual stream (the encoder-decoder's decoder blocks are of this form);
    ``causal_only``: not defined for a bidirectional encoder; ``fields``: the ``model.*``
    fields only this kind reads.
    """

    cfg: ModelConfig = dataclasses.field(repr=False)
    mixer: SequenceMixer
    ffn: FFN
    norm: type[nnx.Module]

    name = ""
    title = ""
    final_norm = True
    pre_norm = False
    causal_only = False
    mup_rule = True  # a published muP rule exists (model.parameterization=mup)
    fields = ()

    def setting(self) -> str:
        """The config setting that chose this kind, for messages."""
        return f"model.norm_position={self.name}"

    def validate(self) -> None:
        """Rules across fields of the model section (raises ConfigError naming the field)."""

    def check_train(self, train: TrainConfig) -> None:
        """Rules between the block kind and the train section."""

    def build(self, rngs: nnx.Rngs) -> nnx.Module:
        raise NotImplementedError

    def param_count(self) -> dict[str, int]:
        """``{"mixer", "ffn", "norms"}``: the layer's parameters by part."""
        norms = 1 + self.ffn.sublayer  # the FFN branch's norm only when there is one
        return {"mixer": self.mixer.param_count(), "ffn": self.ffn.param_count(),
                "norms": norms * self.norm.param_count(self.cfg.d_model)}

    def head_params(self) -> int:
        """Parameters at the end of the stack besides the head: the final norm."""
        return self.norm.param_count(self.cfg.d_model) if self.final_norm else 0

    def head_scale(self, rngs: nnx.Rngs) -> nnx.Module | None:
        """A module whose output ``[vocab]`` multiplies the logits (nGPT's ``s_z``), or None."""
        return None

    def param_constraint(self) -> Callable | None:
        """``params -> params``: where the kind keeps its parameters, applied at init and
        after every optimizer step (nGPT: rows on the unit sphere); None: unconstrained."""
        return None


class PreNormBlock(nnx.Module):
    """``x = x + Mixer(Norm(x)); x = x + FFN(Norm(x))``."""

    def __init__(self, kind: BlockKind, *, rngs: nnx.Rngs):
        cfg = kind.cfg
        self.dropout_rate = cfg.dropout
        self.attn_norm = kind.norm(cfg.d_model, cfg.norm_eps)
        self.attn = kind.mixer.build(rngs)  # the attribute is the checkpoint path
        # model.ffn=none: no FFN branch (attention-only layers), so no norm for it either.
        self.ffn_norm = kind.norm(cfg.d_model, cfg.norm_eps) if kind.ffn.sublayer else None
        self.ffn = kind.ffn.build(rngs)

    def mixer_input(self, x: jax.Array) -> jax.Array:
        """What the mixer reads from the residual stream ``x`` (pre-LN: ``Norm(x)``)."""
        return self.attn_norm(x)

    def __call__(self, x, positions, *, bias=None, documents=None, state=None, start=0,
                 dropout_key=None):
        attn_key, ffn_key = _branch_keys(dropout_key)
        update, state = self.attn(self.attn_norm(x), positions, bias=bias, documents=documents,
                                  state=state, start=start)
        x = x + dropout(update, self.dropout_rate, attn_key)
        if self.ffn is not None:
            x = x + dropout(self.ffn(self.ffn_norm(x)), self.dropout_rate, ffn_key)
        return x, state


class PostNormBlock(PreNormBlock):
    """``x = Norm(x + Mixer(x)); x = Norm(x + FFN(x))`` (Vaswani et al. 2017)."""

    def __call__(self, x, positions, *, bias=None, documents=None, state=None, start=0,
                 dropout_key=None):
        attn_key, ffn_key = _branch_keys(dropout_key)
        update, state = self.attn(x, positions, bias=bias, documents=documents, state=state,
                                  start=start)
        x = self.attn_norm(x + dropout(update, self.dropout_rate, attn_key))
        if self.ffn is not None:
            x = self.ffn_norm(x + dropout(self.ffn(x), self.dropout_rate, ffn_key))
        return x, state

    def mixer_input(self, x):
        return x  # post-LN: the mixer reads the stream itself


def _branch_keys(key: jax.Array | None) -> tuple:
    """The two residual branches' dropout keys (None, None without dropout)."""
    return (None, None) if key is None else tuple(jax.random.split(key))


class PreNorm(BlockKind):
    """Pre-LN (Xiong et al. 2020; GPT-2): the default."""

    name = "pre"
    title = "pre-LN"
    pre_norm = True

    def build(self, rngs):
        return PreNormBlock(self, rngs=rngs)


class PostNorm(BlockKind):
    """Post-LN (Vaswani et al. 2017): each block already ends with a norm, so no final one."""

    name = "post"
    title = "post-LN"
    final_norm = False

    def build(self, rngs):
        return PostNormBlock(self, rngs=rngs)


# --------------------------------------------------------------------------------------------
# Running a stack of layers
# --------------------------------------------------------------------------------------------


def dropout_keys(rng: jax.Array | None, n: int) -> list:
    """``n`` dropout keys from ``rng`` (a stack: one per layer, the last for the embeddings);
    ``n`` Nones without dropout."""
    return [None] * n if rng is None else list(jax.random.split(rng, n))


def run_layer(block: nnx.Module, remat: str, x, positions, *args, **kwargs):
    """``block(x, positions, *args, **kwargs)``, rematerialised in the backward pass under
    ``remat`` (``model.remat``; "none": called as is). Training only: the layer's decode state
    must not be given with a policy. What the layer records (``nnx.Intermediate``: an MoE's
    routing statistics) is left on ``block`` either way."""
    policy = REMAT_POLICIES[remat]
    if policy is None:
        return block(x, positions, *args, **kwargs)
    graphdef, state = nnx.split(block)

    def layer(state, x, args, kwargs):
        return call_recorded(nnx.merge(graphdef, state), x, positions, *args, **kwargs)

    out, recorded = jax.checkpoint(layer, policy=policy)(state, x, args, kwargs)
    nnx.update(block, recorded)
    return out


def call_recorded(block: nnx.Module, *args, **kwargs):
    """``(block(*args, **kwargs), what it recorded)``: the ``nnx.Intermediate`` state popped off
    a block made inside a transformation (``jax.checkpoint``, ``jax.lax.scan``), so that it
    leaves as an output (the transformation's own module objects are not the caller's)."""
    out = block(*args, **kwargs)
    return out, nnx.pop(block, nnx.Intermediate)


def stack_layers(blocks: list[nnx.Module]) -> nnx.Module:
    """One module of the structure of ``blocks[0]`` whose every variable is the ``blocks``'
    stacked along a new leading axis (``[n_layers, ...]``). The layers must be alike (same
    graph, static attributes and shapes; the rules refuse stacks that differ)."""
    graphdef, first = nnx.split(blocks[0])
    states = [first] + [nnx.state(block) for block in blocks[1:]]
    return nnx.merge(graphdef, jax.tree.map(lambda *xs: jnp.stack(xs), *states))


def layer_slice(stacked: nnx.Module, layer: int) -> nnx.Module:
    """Layer ``layer`` of a stacked module (:func:`stack_layers`) as an ordinary block."""
    graphdef, state = nnx.split(stacked)
    return nnx.merge(graphdef, jax.tree.map(lambda a: a[layer], state))
