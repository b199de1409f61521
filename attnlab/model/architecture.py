"""The architecture, resolved once: every registry of parts, and the one place where a model
config becomes the parts a model is built from and where the rules between those parts live.

    arch = resolve(cfg.model)    # frozen, cached; raises ConfigError naming the field
    arch.encoding                # the positional encoding (a decoder's form)
    arch.stack.layers[i]         # layer i's block kind, with its mixer, FFN and norm class
    arch.stack.layers[i].mixer   # its sequence mixer, with its encoding, mask and score scale
    arch.objective               # what the model reads and predicts
    arch = check(cfg)            # resolve, plus the rules between the model and data/train

Each part is a class in one of the registries below, selected by one ``model.*`` field, and
declares the further fields only it reads (``fields``); a field set away from its default
while no part that reads it is used is refused here, by one rule. Modules are handed their
resolved parts; no module looks a part up again.

| field | registry | parts |
|---|---|---|
| ``pos_encoding`` | :data:`ENCODINGS` | positions.py, rope.py, relative.py |
| ``attention_scale`` | :data:`SCORE_SCALES` | scales.py |
| ``attention_mask`` (``attention_window``) | :data:`MASKS` | masks.py |
| ``mixer`` (``attention_every``) | :data:`MIXERS` | mixers.py |
| ``ffn`` | :data:`FFNS` | ffn.py |
| ``head`` | :data:`HEADS` | heads.py |
| ``moe`` | :data:`ROUTINGS` | moe.py (wraps the ``ffn`` part: its experts) |
| ``norm`` | :data:`NORMS` | layers.py |
| ``norm_position`` (``ngpt``) | :data:`BLOCKS` | blocks.py, ngpt.py |
| ``objective`` | :data:`OBJECTIVES` | objectives.py |
| ``inputs`` (``input_dim``) | :data:`INPUTS` | readin.py |
| ``parameterization`` (``mup_base_d_model``) | :data:`PARAMETERIZATIONS` | parameterization.py |
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from attnlab.config import Config, ModelConfig
from attnlab.errors import ConfigError
from attnlab.model import attention, blocks, ffn, heads, layers, masks, mixers, moe, ngpt
from attnlab.model import objectives
from attnlab.model import parameterization, positions, readin, relative, rope, scales

ENCODINGS = {c.name: c for c in (positions.NoPE, positions.Sinusoidal, positions.LearnedPositions,
                                 rope.RoPE, positions.ALiBi, relative.T5Bias)}
SCORE_SCALES = {c.name: c for c in (scales.InverseSqrt, scales.MuPScale, scales.Unscaled,
                                    scales.LearnedTemperature, scales.CosineScale)}
MASKS = {c.name: c for c in (masks.Causal, masks.SlidingWindow)}
MIXERS = {c.name: c for c in (mixers.Softmax, mixers.LinearMixer, mixers.Performer, mixers.Mamba)}
FFNS = {c.name: c for c in (ffn.ReLU, ffn.GELU, ffn.SwiGLU, ffn.GeGLU, ffn.NoFFN,
                             ffn.GELUErf)}
HEADS = {c.name: c for c in (heads.LinearHead, heads.BertHead, heads.T5Head)}
ROUTINGS = {c.name: c for c in (moe.Dense, moe.TokenChoice)}
NORMS = {c.name: c for c in (layers.LayerNorm, layers.RMSNorm)}
BLOCKS = {c.name: c for c in (blocks.PreNorm, blocks.PostNorm, ngpt.NGPT)}
OBJECTIVES = {c.name: c for c in (objectives.CausalLM, objectives.MaskedLM,
                                  objectives.SpanCorruption, objectives.InContextRegression)}
INPUTS = {c.name: c for c in (readin.Tokens, readin.Vectors)}
PARAMETERIZATIONS = {c.name: c for c in (parameterization.Standard, parameterization.MuP)}
REMATS = tuple(layers.REMAT_POLICIES)

# The field that selects a part of each registry. Parts that act inside softmax attention
# (the score scale and the mask) are in use only when some layer forms attention scores.
SELECTORS = {"pos_encoding": ENCODINGS, "attention_scale": SCORE_SCALES,
             "attention_mask": MASKS, "mixer": MIXERS, "ffn": FFNS, "moe": ROUTINGS,
             "norm": NORMS, "norm_position": BLOCKS, "objective": OBJECTIVES, "inputs": INPUTS,
             "parameterization": PARAMETERIZATIONS, "head": HEADS}
INSIDE_ATTENTION = ("attention_scale", "attention_mask")
# Where a model keeps its parts: the decoder-only stack (TransformerLM.blocks, stacked under
# model.scan_layers) and, in each block, the sequence mixer's module.
STACK_ATTRIBUTE, MIXER_ATTRIBUTE, FFN_ATTRIBUTE = "blocks", "attn", "ffn"


@dataclasses.dataclass(frozen=True)
class Stack:
    """One stack of layers: the encoding as its attention reads it, and each layer's block
    kind (with its mixer, FFN and norm class)."""

    encoding: positions.PositionalEncoding
    layers: tuple[blocks.BlockKind, ...]

    @property
    def mixers(self) -> tuple[mixers.SequenceMixer, ...]:
        return tuple(layer.mixer for layer in self.layers)


@dataclasses.dataclass(frozen=True)
class Architecture:
    """Every part of a model built from ``cfg`` (immutable, hashable: modules keep it as static
    structure). ``stack`` reads the input (a decoder, or the encoder of ``mlm`` / ``span``);
    ``decoder`` is the encoder-decoder's second, causal stack (None otherwise)."""

    cfg: ModelConfig = dataclasses.field(repr=False)
    encoding: positions.PositionalEncoding
    objective: objectives.Objective
    ffn: ffn.FFN
    norm: type
    score_scale: scales.ScoreScale
    mask: masks.Mask  # the causal stack's
    stack: Stack
    parameterization: parameterization.Parameterization
    decoder: Stack | None = None
    inputs: readin.Inputs | None = None  # what the model reads and writes (always set)
    head: heads.Head | None = None  # what the last hidden state passes through (always set)

    @property
    def block(self) -> blocks.BlockKind:
        """The block kind of the input stack's first layer: the model-wide hooks."""
        return self.stack.layers[0]

    def undecayed(self, path: tuple[str, ...]) -> bool:
        """Whether the parameter at ``path`` (the names of its state path) is one that its
        layer's sequence mixer or FFN holds out of weight decay (``SequenceMixer.undecayed``,
        ``FFN.undecayed``): a parameter of the module a block keeps at ``attn`` or ``ffn``."""
        held_out = {MIXER_ATTRIBUTE: {name for stack in filter(None, (self.stack, self.decoder))
                                      for mixer in stack.mixers for name in mixer.undecayed},
                    FFN_ATTRIBUTE: set(self.ffn.undecayed)}
        return any(path[i + 1] in held_out[name] for i, name in enumerate(path[:-1])
                   if name in held_out)

    def stacked_axes(self, path: tuple[str, ...]) -> int:
        """Leading axes a parameter carries beyond its layer's own shape: 1 for the layers of a
        scanned stack (``model.scan_layers``: ``[n_layers, ...]``), else 0."""
        return int(self.cfg.scan_layers and path[:1] == (STACK_ATTRIBUTE,))


@functools.lru_cache(maxsize=256)
def resolve(cfg: ModelConfig) -> Architecture:
    """The parts of ``cfg``, checked against each other (once per config: cached).

    Raises:
      ConfigError: naming the first field at fault, before anything is built.
    """
    _check_choices(cfg)
    encoding = ENCODINGS[cfg.pos_encoding](cfg)
    encoding.validate()  # e.g. RoPE: even head_dim; sinusoidal: even d_model
    mask = _mask(cfg)
    param = PARAMETERIZATIONS[cfg.parameterization](cfg)
    # model.moe: the configured FFN as it is, or as the experts of a routed layer
    parts = dict(ffn=ROUTINGS[cfg.moe].around(FFNS[cfg.ffn](cfg)), norm=NORMS[cfg.norm],
                 score_scale=param.anchored(SCORE_SCALES[cfg.attention_scale](cfg)))
    causal = _stack(cfg, encoding, mask, **parts)
    objective = OBJECTIVES[cfg.objective](cfg)
    if objective.causal:
        stack, decoder = causal, None
    else:  # an encoder: T5's bidirectional buckets, every key visible
        stack = _stack(cfg, encoding.for_encoder(), masks.Bidirectional(cfg), **parts)
        decoder = causal if objective.encoder_decoder else None
    arch = Architecture(cfg, encoding, objective, mask=mask, stack=stack, decoder=decoder,
                        inputs=INPUTS[cfg.inputs](cfg), parameterization=param,
                        head=HEADS[cfg.head](cfg, parts["ffn"], parts["norm"]), **parts)
    _validate(arch)
    return arch


def _check_choices(cfg: ModelConfig) -> None:
    for field, registry in SELECTORS.items():
        valid = tuple(k for k in registry if (field, k) != ("norm_position", ngpt.NGPT.name))
        _check_choice(f"model.{field}", getattr(cfg, field), valid)
    _check_choice("model.attention_impl", cfg.attention_impl, tuple(attention.IMPLEMENTATIONS))
    _check_choice("model.remat", cfg.remat, REMATS)


def _check_choice(path: str, value: str, valid: tuple[str, ...]) -> None:
    if value not in valid:
        raise ConfigError(path, f"unknown value {value!r}; valid values are {', '.join(valid)}")


def _mask(cfg: ModelConfig) -> masks.Mask:
    """The decoder's mask: ``model.attention_mask``, or the sliding window when
    ``model.attention_window`` is set (that field predates the registry)."""
    name = masks.SlidingWindow.name if cfg.attention_window else cfg.attention_mask
    return MASKS[name](cfg)


def _stack(cfg: ModelConfig, encoding, mask, *, ffn, norm, score_scale) -> Stack:
    """Each layer's block kind: softmax on every ``attention_every``-th layer of a hybrid,
    ``MIXERS[model.mixer]`` elsewhere; nGPT blocks with ``model.ngpt`` (a field that predates
    the block registry), else ``BLOCKS[model.norm_position]``."""
    kind = BLOCKS[ngpt.NGPT.name if cfg.ngpt else cfg.norm_position]
    layers = []
    for layer in range(cfg.n_layers):
        hybrid = cfg.attention_every and (layer + 1) % cfg.attention_every == 0
        mixer = (mixers.Softmax if hybrid else MIXERS[cfg.mixer])(
            cfg, layer, encoding, mask, score_scale, norm)
        layers.append(kind(cfg, mixer, ffn, norm))
    return Stack(encoding, tuple(layers))


def _validate(arch: Architecture) -> None:
    """Every rule between parts, in a fixed order (the first broken one is reported)."""
    cfg = arch.cfg
    causal = arch.decoder or arch.stack
    # The configured mixer's rules (a hybrid's softmax layers are not a "softmax model").
    MIXERS[cfg.mixer](cfg, 0, arch.encoding, arch.mask, arch.score_scale, arch.norm).validate()
    arch.ffn.validate()  # e.g. an MoE's k > E, MoE with nGPT
    arch.parameterization.validate(arch)  # muP: its base width, parts with a muP rule
    causal.layers[0].validate()  # the block kind's (nGPT's)
    if not arch.ffn.sublayer and arch.decoder is not None:  # (nGPT refuses it: swiglu only)
        raise ConfigError("model.ffn", f"none (attention-only layers) is built for one stack "
                          f"of pre-LN or post-LN blocks, not model.objective={cfg.objective}")
    arch.score_scale.validate()  # e.g. cosine attention with qk_norm
    arch.mask.validate()
    arch.inputs.validate(arch.objective)  # e.g. regression with inputs=tokens
    _check_unused_fields(arch)
    if cfg.scan_layers:
        _check_scan(arch)
    arch.objective.validate(arch.stack.layers, arch.mask)  # e.g. mlm with a causal-only mixer
    if cfg.embedding_norm and (arch.decoder is not None or cfg.ngpt
                               or type(arch.inputs) is not readin.Tokens):
        raise ConfigError("model.embedding_norm", "is built by the token decoder and the mlm "
                          "encoder (pre- or post-LN) only, not by the encoder-decoder, nGPT or "
                          "a vector read-in")
    arch.head.validate(arch)
    arch.stack.encoding.validate()  # T5's encoder buckets


def _used_parts(arch: Architecture) -> list[tuple[str, Any]]:
    """``(selector field, part)`` of every part the model uses."""
    used = [("pos_encoding", arch.encoding), ("ffn", arch.ffn), ("moe", arch.ffn),
            ("norm", arch.norm), ("objective", arch.objective), ("inputs", arch.inputs),
            ("parameterization", arch.parameterization), ("head", arch.head)]
    for stack in filter(None, (arch.stack, arch.decoder)):
        used += [("mixer", layer.mixer) for layer in stack.layers]
        used += [("norm_position", layer) for layer in stack.layers]
    if any(layer.mixer.forms_scores for layer in arch.stack.layers):
        used += [("attention_scale", arch.score_scale), ("attention_mask", arch.mask)]
    return used


def _check_unused_fields(arch: Architecture) -> None:
    """A field that only unused parts read, set away from its default, is refused. A mixer's
    own settings are exempt: a sweep over ``model.mixer`` shares one base config."""
    cfg, defaults = arch.cfg, ModelConfig()
    used = _used_parts(arch)
    used_fields = {f for selector, part in used for f in (selector, *part.fields)}
    for selector, registry in SELECTORS.items():
        if registry is MIXERS:
            continue
        owned = (selector,) if selector in INSIDE_ATTENTION else ()
        for cls in registry.values():
            for name in owned + tuple(cls.fields):
                if name in used_fields or getattr(cfg, name) == getattr(defaults, name):
                    continue
                if selector in INSIDE_ATTENTION:
                    raise ConfigError(f"model.{name}",
                                      f"acts on softmax attention, which model.mixer={cfg.mixer} "
                                      "never forms (a hybrid's attention layers do: "
                                      "model.attention_every)")
                owners = " and ".join(c.title or c.name for c in registry.values()
                                      if name in c.fields)
                raise ConfigError(f"model.{name}",
                                  f"is read only by {owners}; model.{selector}="
                                  f"{getattr(cfg, selector)} does not use it")


def _check_scan(arch: Architecture) -> None:
    """``model.scan_layers``: one stacked layer run by a scan needs every layer alike (same
    parameters and static attributes); the combinations whose layers differ are refused."""
    cfg = arch.cfg
    layer_mixers = arch.stack.mixers
    if len({type(mixer) for mixer in layer_mixers}) > 1:
        raise ConfigError("model.scan_layers",
                          f"needs identical layers; model.attention_every={cfg.attention_every} "
                          f"makes some layers softmax attention and others {cfg.mixer}")
    if any(mixer.layer_constants for mixer in layer_mixers):
        raise ConfigError("model.scan_layers",
                          f"needs identical layers; model.mixer={cfg.mixer} fixes different "
                          "constants (random features) per layer")
    if arch.decoder is not None:
        raise ConfigError("model.scan_layers",
                          f"is not implemented for the encoder-decoder "
                          f"(model.objective={cfg.objective}); use it with clm or mlm")


def check(cfg: Config) -> Architecture:
    """:func:`resolve` of the model section, plus the rules between the model and the data and
    train sections (raises ConfigError naming the field)."""
    arch = resolve(cfg.model)
    limit = arch.encoding.max_positions()
    if limit is not None and cfg.data.seq_len > limit:
        raise ConfigError(
            "data.seq_len",
            f"{cfg.data.seq_len} exceeds the {limit} positions of the {arch.encoding.range_name}",
        )
    if cfg.model.attention_window > cfg.data.seq_len:
        raise ConfigError(
            "model.attention_window",
            f"{cfg.model.attention_window} is longer than the training context data.seq_len="
            f"{cfg.data.seq_len}: it would train full attention (0 = full causal attention)",
        )
    if cfg.data.document_mask and (arch.decoder is not None
                                   or type(arch.inputs) is not readin.Tokens):
        raise ConfigError("data.document_mask", (
            f"is built for one stack reading tokens, not model.objective={cfg.model.objective} "
            f"with model.inputs={cfg.model.inputs} (span corruption draws its spans across the "
            "whole window)"))
    arch.block.check_train(cfg.train)
    arch.ffn.check_train(cfg.train)
    return arch


def rescaled(cfg: ModelConfig, method: str, factor: float, train_length: int = 0) -> ModelConfig:
    """The model config to evaluate with at ``factor`` x the training context ``train_length``
    (tokens; YaRN needs it, 0 = unknown), by the encoding's rescaling ``method`` (``"none"``:
    unchanged for every encoding).

    Raises:
      RescalingError: the encoding has no rescaling ``method``.
    """
    encoding = resolve(cfg).encoding
    if not encoding.can_rescale(method):
        owners = [c.title or c.name for c in ENCODINGS.values() if method in c.rescalings]
        where = f"{' and '.join(owners)} models" if owners else "no encoding"
        raise positions.RescalingError(
            f"{method} applies to {where}; this run uses pos_encoding={encoding.name}")
    return encoding.rescalings[method](cfg, factor, train_length)
