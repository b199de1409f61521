"""The Transformer LMs (Flax NNX), used functionally: the decoder-only LM and the BERT-style
encoder (:class:`TransformerLM`, causal or not by ``model.objective``), and the T5-style
encoder-decoder (:class:`EncoderDecoderLM`).

The model is built once and split into a static ``GraphDef`` and a ``State`` of float32
parameters (:func:`init_model`); :func:`apply` is a pure function of that state, safe to wrap in
``jax.jit(lambda state, tokens: apply(graphdef, state, tokens))``. Nothing mutates module state
inside jit (dropout takes an explicit key).

    x = encoding.embed(E[tokens], positions)   (adds P[positions] for learned / sinusoidal)
    pre-LN:  x = x + Attn(Norm(x));  x = x + FFN(Norm(x));  ... ; logits = Norm(x) W_head
    post-LN: x = Norm(x + Attn(x));  x = Norm(x + FFN(x));  ... ; logits = x W_head
    W_head = E^T when tied.

Encoder-decoder (Vaswani et al. 2017; Raffel et al. 2020), pre-LN only:

    m = Norm_enc(Encoder(embed(source)))              bidirectional self-attention blocks
    y = y + SelfAttn(Norm(y)) (causal); y = y + CrossAttn(Norm(y), m); y = y + FFN(Norm(y))
    logits = Norm_dec(y) E^T

``model.scan_layers``: the decoder/encoder stack is held as ONE block whose parameters carry a
leading ``[n_layers, ...]`` axis and is run by ``jax.lax.scan``, so the step is traced once per
layer *body*, not once per layer (trace and compile time flat in depth). The stacked parameters
are the unrolled model's, stacked: the same seed gives the same model either way.
``model.remat``: each layer's forward is wrapped in ``jax.checkpoint``
(:data:`attnlab.model.layers.REMAT_POLICIES`).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnlab.model.attention import CrossAttention
from attnlab.model.config import ModelConfig
from attnlab.model.decoding import KVCache
from attnlab.model.layers import (REMAT_POLICIES, FeedForward, compute_dtype, dropout, make_norm,
                                   project)
from attnlab.model.mixers import mixer_for
from attnlab.model.ngpt import NGPTBlock, Scale, renormalize
from attnlab.model.objectives import objective_for, token_losses
from attnlab.model.positions import check_positions, encoding_for

KV_CACHE = "KV cache"


def run_layer(block: nnx.Module, remat: str, x, positions, *args, **kwargs):
    """``block(x, positions, *args, **kwargs)``, rematerialised in the backward pass under
    ``remat`` (``model.remat``; "none": called as is). Training only: the layer's decode state
    (``kv``) must not be given with a policy."""
    if remat == "none":
        return block(x, positions, *args, **kwargs)
    graphdef, state = nnx.split(block)

    def layer(state, x, args, kwargs):
        return nnx.merge(graphdef, state)(x, positions, *args, **kwargs)

    return jax.checkpoint(layer, policy=REMAT_POLICIES[remat])(state, x, args, kwargs)


def stack_layers(blocks: list[nnx.Module]) -> nnx.Module:
    """One module of the structure of ``blocks[0]`` whose every variable is the ``blocks``'
    stacked along a new leading axis (``[n_layers, ...]``). The layers must be alike (same
    graph, static attributes and shapes; the config's validation refuses stacks that differ)."""
    graphdef, first = nnx.split(blocks[0])
    states = [first] + [nnx.state(block) for block in blocks[1:]]
    return nnx.merge(graphdef, jax.tree.map(lambda *xs: jnp.stack(xs), *states))


def layer_slice(stacked: nnx.Module, layer: int) -> nnx.Module:
    """Layer ``layer`` of a stacked module (:func:`stack_layers`) as an ordinary block."""
    graphdef, state = nnx.split(stacked)
    return nnx.merge(graphdef, jax.tree.map(lambda a: a[layer], state))


class Block(nnx.Module):
    """One Transformer layer: sequence-mixer and FFN sublayers with residual connections.

    The mixer (softmax attention by default; see :mod:`attnlab.model.mixers`) is asked of the
    registry for this ``layer`` and kept at the attribute ``attn`` (the checkpoint path).
    """

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, layer: int = 0, causal: bool = True):
        self.pre_norm = cfg.norm_position == "pre"
        self.dropout_rate = cfg.dropout
        self.attn_norm = make_norm(cfg, cfg.d_model)
        # An encoder layer (causal=False) is bidirectional softmax attention (validated).
        extra = {} if causal else {"bidirectional": True}
        self.attn = mixer_for(cfg, layer).build(rngs, **extra)
        self.ffn_norm = make_norm(cfg, cfg.d_model)
        self.ffn = FeedForward(cfg, rngs=rngs)

    def __call__(self, x, positions, *, dropout_key=None, kv=None, start=0, pos_params=None):
        """``x [batch, seq, d_model]``, ``positions [pbatch, seq]`` -> ``(x, kv)``.

        ``pos_params``: the positional encoding's parameters for this layer's score bias (T5's
        table; None for every other encoding), passed to the mixer only when given.

        With ``kv`` (this layer's decode state: a KV cache, see
        :meth:`CausalSelfAttention.__call__`, or a recurrent state) the mixer reads and extends it
        at ``start``; otherwise it mixes the whole sequence and the returned ``kv`` is None.
        """
        attn_key = ffn_key = None
        if dropout_key is not None:
            attn_key, ffn_key = jax.random.split(dropout_key)
        extra = {} if pos_params is None else {"pos_params": pos_params}
        if self.pre_norm:
            update, kv = self.attn(self.attn_norm(x), positions, kv=kv, start=start, **extra)
            x = x + dropout(update, self.dropout_rate, attn_key)
            x = x + dropout(self.ffn(self.ffn_norm(x)), self.dropout_rate, ffn_key)
        else:  # classic post-LN (Vaswani et al. 2017): normalise after the residual add
            update, kv = self.attn(x, positions, kv=kv, start=start, **extra)
            x = self.attn_norm(x + dropout(update, self.dropout_rate, attn_key))
            x = self.ffn_norm(x + dropout(self.ffn(x), self.dropout_rate, ffn_key))
        return x, kv


class TransformerLM(nnx.Module):
    """One stack of Transformer layers with an LM head: a causal decoder, or (for an objective
    whose input stack is not causal, ``mlm``) a bidirectional encoder. Every architectural
    choice comes from ``cfg``."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        causal = objective_for(cfg).causal
        self.encoding = encoding_for(cfg, bidirectional=not causal)
        init = nnx.initializers.normal(cfg.init_std)
        self.token_embedding = nnx.Param(init(rngs.params(), (cfg.vocab_size, cfg.d_model)))
        # The encoding's table (learned positions; None for the others) keeps this attribute
        # name: it is the parameter path in checkpoints.
        self.position_embedding = self.encoding.init_params(rngs)
        block = NGPTBlock if cfg.ngpt else Block
        extra = {} if causal else {"causal": False}
        blocks = [block(cfg, rngs=rngs, layer=i, **extra) for i in range(cfg.n_layers)]
        # scan_layers: the same layers (same RNG draws), stacked: parameters [n_layers, ...].
        self.blocks = stack_layers(blocks) if cfg.scan_layers else nnx.List(blocks)
        # Post-LN already ends every block with a norm, so only pre-LN has a final one (nGPT:
        # none, its hidden states are unit vectors).
        pre = cfg.norm_position == "pre" and not cfg.ngpt
        self.final_norm = make_norm(cfg, cfg.d_model) if pre else None
        self.lm_head = (
            None
            if cfg.tie_embeddings
            else nnx.Param(init(rngs.params(), (cfg.d_model, cfg.vocab_size)))
        )
        # nGPT (attnlab/model/ngpt.py): logits scaled by s_z; every matrix starts with unit rows.
        self.logit_scale = Scale(cfg.vocab_size, 1.0, cfg.d_model**-0.5) if cfg.ngpt else None
        if cfg.ngpt:
            nnx.update(self, renormalize(nnx.state(self, nnx.Param)))

    # ---------------------------------------------------------------------------------------

    def _positions(self, positions, batch: int, seq: int) -> jax.Array:
        """Normalises positions to int32 ``[pbatch, seq]`` and checks the encoding's range."""
        if positions is None:
            positions = np.arange(seq, dtype=np.int32)[None]  # concrete: checked at trace time
        elif not isinstance(positions, jax.core.Tracer):
            positions = np.asarray(positions)
        if positions.ndim == 1:
            positions = positions[None]
        if positions.ndim != 2 or positions.shape[1] != seq or positions.shape[0] not in (1, batch):
            raise ValueError(
                f"positions must have shape [seq] or [batch, seq] = [{batch}, {seq}], "
                f"got {tuple(positions.shape)}"
            )
        self.encoding.check_range(positions)
        return jnp.asarray(positions, jnp.int32)

    def embed(self, tokens: jax.Array, positions: jax.Array) -> jax.Array:
        """``tokens [batch, seq]``, ``positions [pbatch, seq]`` -> ``[batch, seq, d_model]``."""
        x = jnp.take(self.token_embedding[...], tokens, axis=0)
        x = self.encoding.embed(x, positions, self.position_embedding)
        return x.astype(compute_dtype(self.cfg))

    def logits(self, x: jax.Array) -> jax.Array:
        """``[batch, seq, d_model] -> float32 [batch, seq, vocab]`` (final norm for pre-LN)."""
        if self.final_norm is not None:
            x = self.final_norm(x)
        if self.lm_head is None:
            head = self.token_embedding[...].T  # tied: W_head = E^T
        else:
            head = self.lm_head[...]
        logits = project(x, head.astype(x.dtype), jnp.float32)  # "bsd,dv->bsv"
        return logits if self.logit_scale is None else logits * self.logit_scale()

    def __call__(self, tokens, positions=None, *, deterministic: bool = True, dropout_rng=None):
        """Logits of every position.

        Args:
          tokens: int32 ``[batch, seq]``.
          positions: int32 ``[seq]`` or ``[batch, seq]``; default ``arange(seq)``.
          deterministic: no dropout. When False and ``cfg.dropout > 0``, ``dropout_rng`` is
            required.
          dropout_rng: PRNG key for dropout.

        Returns:
          float32 ``[batch, seq, vocab]``.
        """
        batch, seq = tokens.shape
        positions = self._positions(positions, batch, seq)
        use_dropout = not deterministic and self.cfg.dropout > 0
        if use_dropout and dropout_rng is None:
            raise ValueError(
                "dropout is on (deterministic=False, model.dropout > 0): pass dropout_rng"
            )
        n_layers = self.cfg.n_layers
        keys = [None] * (n_layers + 1)
        if use_dropout:
            split = jax.random.split(dropout_rng, n_layers + 1)
            keys = list(split)
        x = dropout(self.embed(tokens, positions), self.cfg.dropout, keys[-1])
        if self.cfg.scan_layers:  # layer i draws keys[i], as unrolled
            layer_keys = split[:-1] if use_dropout else None
            return self.logits(self._scan_layers(x, positions, layer_keys))
        remat = self.cfg.remat
        for layer, (block, key) in enumerate(zip(self.blocks, keys)):
            x, _ = run_layer(block, remat, x, positions, dropout_key=key,
                             pos_params=self.pos_params(layer))
        return self.logits(x)

    def _scan_layers(self, x, positions, keys):
        """The stacked layers (``model.scan_layers``) over ``x [batch, seq, d_model]`` by one
        ``jax.lax.scan``; ``keys``: the layers' dropout keys ``[n_layers]`` or None. The
        encoding's bias parameters are read per layer by a traced index (T5's per-layer table
        is sliced, a shared one is the same array each step)."""
        graphdef, stacked = nnx.split(self.blocks)
        table = None if self.position_embedding is None else self.position_embedding[...]
        encoding, remat = self.encoding, self.cfg.remat

        def body(x, inputs):
            state, key, layer = inputs
            block = nnx.merge(graphdef, state)
            pos_params = encoding.layer_params(table, layer)
            x, _ = run_layer(block, remat, x, positions, dropout_key=key, pos_params=pos_params)
            return x, None

        layers = jnp.arange(self.cfg.n_layers, dtype=jnp.int32)
        x, _ = jax.lax.scan(body, x, (stacked, keys, layers))
        return x

    def layers(self) -> list[nnx.Module]:
        """Every layer as its own block (a stacked model's are slices of the stacked
        parameters)."""
        if self.cfg.scan_layers:
            return [layer_slice(self.blocks, i) for i in range(self.cfg.n_layers)]
        return list(self.blocks)

    def pos_params(self, layer: int):
        """The encoding's bias parameters for ``layer`` (T5's shared or per-layer table)."""
        return self.encoding.layer_params(self.position_embedding, layer)

    def decode(self, tokens, start, cache, *, check_range: bool = True):
        """KV-cache forward of ``t`` new tokens at positions ``start .. start + t - 1``.

        Args:
          tokens: int32 ``[batch, t]``.
          start: int or traced int: how many tokens the cache already holds.
          cache: :class:`attnlab.model.decoding.KVCache`.
          check_range: verify that ``start + t`` fits the cache and the encoding (callers
            that have checked the whole generation statically pass False).

        Returns:
          ``(logits float32 [batch, t, vocab], cache)``.
        """
        if not objective_for(self.cfg).causal:
            raise ValueError(f"model.objective={self.cfg.objective} is a bidirectional encoder: "
                             "it has no KV-cache decoding (fill masks instead)")
        batch, t = tokens.shape
        # Attention layers hold max_len positions; recurrent states (linear attention, Mamba) any.
        lengths = [mixer_for(self.cfg, layer).state_length((keys, values))
                   for layer, (keys, values) in enumerate(zip(cache.keys, cache.values))]
        lengths = [n for n in lengths if n is not None]
        if isinstance(start, jax.core.Tracer):
            positions = (start + jnp.arange(t, dtype=jnp.int32))[None]
        else:
            positions = (int(start) + np.arange(t, dtype=np.int32))[None]
        if check_range:
            if lengths:
                check_positions(positions, min(lengths), KV_CACHE)
            self.encoding.check_range(positions)
        positions = jnp.asarray(positions, jnp.int32)
        x = self.embed(tokens, positions)
        new_keys, new_values = [], []
        # A stacked model decodes layer by layer too (slices of its parameters): decoding is
        # not differentiated, and the per-layer caches stay where they are.
        blocks = self.layers()
        for layer, (block, keys, values) in enumerate(zip(blocks, cache.keys, cache.values)):
            x, (keys, values) = block(x, positions, kv=(keys, values), start=start,
                                      pos_params=self.pos_params(layer))
            new_keys.append(keys)
            new_values.append(values)
        return self.logits(x), type(cache)(tuple(new_keys), tuple(new_values))


class DecoderBlock(nnx.Module):
    """One pre-LN decoder layer of the encoder-decoder: causal self-attention, cross-attention
    to the encoder output, FFN, each with a residual connection."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, layer: int = 0):
        self.dropout_rate = cfg.dropout
        self.attn_norm = make_norm(cfg, cfg.d_model)
        self.attn = mixer_for(cfg, layer).build(rngs)
        self.cross_norm = make_norm(cfg, cfg.d_model)
        self.cross = CrossAttention(cfg, rngs=rngs)
        self.ffn_norm = make_norm(cfg, cfg.d_model)
        self.ffn = FeedForward(cfg, rngs=rngs)

    def __call__(self, y, positions, memory_kv, *, dropout_key=None, kv=None, start=0,
                 pos_params=None):
        """``y [batch, t, d_model]`` at ``positions [pbatch, t]``, the encoder's keys/values
        ``memory_kv`` (:meth:`CrossAttention.keys_values`) -> ``(y, kv)`` (``kv``: this layer's
        self-attention KV cache, or None without one)."""
        keys = [None] * 3
        if dropout_key is not None:
            keys = list(jax.random.split(dropout_key, 3))
        extra = {} if pos_params is None else {"pos_params": pos_params}
        update, kv = self.attn(self.attn_norm(y), positions, kv=kv, start=start, **extra)
        y = y + dropout(update, self.dropout_rate, keys[0])
        y = y + dropout(self.cross(self.cross_norm(y), memory_kv), self.dropout_rate, keys[1])
        y = y + dropout(self.ffn(self.ffn_norm(y)), self.dropout_rate, keys[2])
        return y, kv


class EncDecCache(NamedTuple):
    """Decode state of the encoder-decoder: the decoder's self-attention KV cache and, per
    decoder layer, the cross-attention keys/values of the encoder output (computed once),
    each ``[batch, source_len, kv_heads, head_dim]``."""

    self_kv: KVCache
    cross: tuple[tuple[jax.Array, jax.Array], ...]


class EncoderDecoderLM(nnx.Module):
    """T5-style encoder-decoder (Raffel et al. 2020): ``model.n_layers`` bidirectional encoder
    blocks and as many causal decoder blocks with cross-attention; one token table shared by
    both stacks and the (tied or untied) head. The encoding's parameters (learned table, T5
    bias) exist once per stack: ``position_embedding`` (encoder, T5's bidirectional buckets) and
    ``decoder_position_embedding`` (decoder, causal buckets)."""

    cache_type = EncDecCache

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.encoder_encoding = encoding_for(cfg, bidirectional=True)
        self.encoding = encoding_for(cfg)  # the decoder's
        init = nnx.initializers.normal(cfg.init_std)
        self.token_embedding = nnx.Param(init(rngs.params(), (cfg.vocab_size, cfg.d_model)))
        self.position_embedding = self.encoder_encoding.init_params(rngs)
        self.decoder_position_embedding = self.encoding.init_params(rngs)
        self.encoder = nnx.List([Block(cfg, rngs=rngs, layer=i, causal=False)
                                 for i in range(cfg.n_layers)])
        self.encoder_norm = make_norm(cfg, cfg.d_model)
        self.decoder = nnx.List([DecoderBlock(cfg, rngs=rngs, layer=i)
                                 for i in range(cfg.n_layers)])
        self.final_norm = make_norm(cfg, cfg.d_model)
        self.lm_head = (
            None
            if cfg.tie_embeddings
            else nnx.Param(init(rngs.params(), (cfg.d_model, cfg.vocab_size)))
        )

    def _embed(self, tokens, positions, encoding, table):
        x = jnp.take(self.token_embedding[...], tokens, axis=0)
        return encoding.embed(x, positions, table).astype(compute_dtype(self.cfg))

    def encode(self, source: jax.Array, *, dropout_rng=None) -> jax.Array:
        """``source int32 [batch, s]`` -> the encoder output ``[batch, s, d_model]``."""
        seq = source.shape[1]
        positions = np.arange(seq, dtype=np.int32)[None]
        self.encoder_encoding.check_range(positions)
        keys = [None] * (len(self.encoder) + 1)
        if dropout_rng is not None:
            keys = list(jax.random.split(dropout_rng, len(self.encoder) + 1))
        x = self._embed(source, positions, self.encoder_encoding, self.position_embedding)
        x = dropout(x, self.cfg.dropout, keys[-1])
        for layer, (block, key) in enumerate(zip(self.encoder, keys)):
            params = self.encoder_encoding.layer_params(self.position_embedding, layer)
            x, _ = run_layer(block, self.cfg.remat, x, positions, dropout_key=key,
                             pos_params=params)
        return self.encoder_norm(x)

    def cross_keys_values(self, memory: jax.Array) -> tuple[tuple[jax.Array, jax.Array], ...]:
        """Every decoder layer's cross-attention keys/values of ``memory [batch, s, d]``."""
        return tuple(block.cross.keys_values(memory) for block in self.decoder)

    def logits(self, y: jax.Array) -> jax.Array:
        """``[batch, t, d_model] -> float32 [batch, t, vocab]`` (final norm, then the head)."""
        y = self.final_norm(y)
        head = self.token_embedding[...].T if self.lm_head is None else self.lm_head[...]
        return project(y, head.astype(y.dtype), jnp.float32)  # "btd,dv->btv"

    def _decoder(self, targets, positions, cross, *, caches=None, start=0, dropout_rng=None):
        keys = [None] * (len(self.decoder) + 1)
        if dropout_rng is not None:
            keys = list(jax.random.split(dropout_rng, len(self.decoder) + 1))
        y = self._embed(targets, positions, self.encoding, self.decoder_position_embedding)
        y = dropout(y, self.cfg.dropout, keys[-1])
        new_caches = []
        for layer, (block, memory_kv, key) in enumerate(zip(self.decoder, cross, keys)):
            params = self.encoding.layer_params(self.decoder_position_embedding, layer)
            if caches is None:  # training / teacher forcing: rematerialised per model.remat
                y, kv = run_layer(block, self.cfg.remat, y, positions, memory_kv,
                                  dropout_key=key, pos_params=params)
            else:
                y, kv = block(y, positions, memory_kv, dropout_key=key, kv=caches[layer],
                              start=start, pos_params=params)
            new_caches.append(kv)
        return self.logits(y), new_caches

    def __call__(self, source, targets, *, deterministic: bool = True, dropout_rng=None):
        """Teacher-forced logits.

        Args:
          source: int32 ``[batch, s]``, the (corrupted) encoder input.
          targets: int32 ``[batch, t]``, the decoder input (start token + target[:-1]).

        Returns:
          float32 ``[batch, t, vocab]``.
        """
        enc_rng = dec_rng = None
        if not deterministic and self.cfg.dropout > 0:
            if dropout_rng is None:
                raise ValueError(
                    "dropout is on (deterministic=False, model.dropout > 0): pass dropout_rng")
            enc_rng, dec_rng = jax.random.split(dropout_rng)
        memory = self.encode(source, dropout_rng=enc_rng)
        positions = np.arange(targets.shape[1], dtype=np.int32)[None]
        self.encoding.check_range(positions)
        logits, _ = self._decoder(targets, positions, self.cross_keys_values(memory),
                                  dropout_rng=dec_rng)
        return logits

    def decode(self, tokens, start, cache: EncDecCache):
        """KV-cache step of the decoder: ``tokens int32 [batch, t]`` at positions ``start ..
        start + t - 1`` against ``cache`` (:func:`attnlab.model.decoding.init_encdec_cache`).

        Returns ``(logits float32 [batch, t, vocab], cache)``."""
        t = tokens.shape[1]
        positions = (start + jnp.arange(t, dtype=jnp.int32))[None]
        caches = list(zip(cache.self_kv.keys, cache.self_kv.values))
        logits, new = self._decoder(tokens, positions, cache.cross, caches=caches, start=start)
        self_kv = KVCache(tuple(k for k, _ in new), tuple(v for _, v in new))
        return logits, EncDecCache(self_kv, cache.cross)


def model_class(cfg: ModelConfig) -> type[nnx.Module]:
    """The module ``cfg`` builds: the encoder-decoder for an objective that has one, otherwise
    the single stack (decoder or encoder)."""
    return EncoderDecoderLM if objective_for(cfg).encoder_decoder else TransformerLM


def init_model(cfg: ModelConfig, seed: int) -> tuple[nnx.GraphDef, nnx.State]:
    """Builds the model and splits it once into ``(graphdef, state)``; ``state`` holds only the
    float32 ``nnx.Param`` leaves."""
    model = model_class(cfg)(cfg, rngs=nnx.Rngs(params=seed))
    graphdef, state = nnx.split(model)
    return graphdef, state


def apply(graphdef: nnx.GraphDef, state: nnx.State, tokens, positions=None, *, dropout_rng=None):
    """Pure forward pass of a single-stack model: float32 logits ``[batch, seq, vocab]``.

    Dropout is applied (at ``cfg.dropout``) iff ``dropout_rng`` is given. Jit with the graphdef
    closed over or static.
    """
    model = nnx.merge(graphdef, state)
    return model(tokens, positions, deterministic=dropout_rng is None, dropout_rng=dropout_rng)


__all__ = ["Block", "DecoderBlock", "EncDecCache", "EncoderDecoderLM", "REMAT_POLICIES",
           "TransformerLM", "apply", "init_model", "layer_slice", "model_class", "run_layer",
           "stack_layers", "token_losses"]
