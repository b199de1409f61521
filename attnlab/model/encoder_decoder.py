"""The T5-style encoder-decoder (Vaswani et al. 2017; Raffel et al. 2020), pre-LN only, built
from its resolved :class:`~attnlab.model.architecture.Architecture` (``model.objective=span``):

    m = Norm_enc(Encoder(embed(source)))              bidirectional self-attention blocks
    y = y + SelfAttn(Norm(y)) (causal); y = y + CrossAttn(Norm(y), m); y = y + FFN(Norm(y))
    logits = Norm_dec(y) E^T                           (model.head=t5: Norm_dec(y) d^-0.5 E^T)

One token table is shared by both stacks and the (tied or untied) head. The encoding's
parameters (learned table, T5 bias) exist once per stack: ``position_embedding`` (encoder, T5's
bidirectional buckets) and ``decoder_position_embedding`` (decoder, causal buckets).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnlab.model.attention import CrossAttention
from attnlab.model.blocks import BlockKind, dropout_keys, run_layer
from attnlab.model.decoding import DecodeState
from attnlab.model.layers import compute_dtype, dropout, project


class DecoderBlock(nnx.Module):
    """One pre-LN decoder layer: causal self-attention (the layer's mixer), cross-attention to
    the encoder output, FFN, each with a residual connection."""

    def __init__(self, kind: BlockKind, *, rngs: nnx.Rngs):
        cfg = kind.cfg
        self.dropout_rate = cfg.dropout
        self.attn_norm = kind.norm(cfg.d_model, cfg.norm_eps)
        self.attn = kind.mixer.build(rngs)
        self.cross_norm = kind.norm(cfg.d_model, cfg.norm_eps)
        self.cross = CrossAttention(cfg, score_scale=kind.mixer.score_scale, rngs=rngs)
        self.ffn_norm = kind.norm(cfg.d_model, cfg.norm_eps)
        self.ffn = kind.ffn.build(rngs)

    def __call__(self, y, positions, memory_kv, *, bias=None, state=None, start=0,
                 dropout_key=None):
        """``y [batch, t, d_model]`` at ``positions [pbatch, t]``, the encoder's keys/values
        ``memory_kv`` (:meth:`CrossAttention.keys_values`) -> ``(y, state)`` (``state``: this
        layer's self-attention KV cache, or None without one)."""
        keys = dropout_keys(dropout_key, 3)
        update, state = self.attn(self.attn_norm(y), positions, bias=bias, state=state,
                                  start=start)
        y = y + dropout(update, self.dropout_rate, keys[0])
        y = y + dropout(self.cross(self.cross_norm(y), memory_kv), self.dropout_rate, keys[1])
        y = y + dropout(self.ffn(self.ffn_norm(y)), self.dropout_rate, keys[2])
        return y, state


class EncDecState(NamedTuple):
    """Decode state of the encoder-decoder: the decoder's self-attention state and, per decoder
    layer, the cross-attention keys/values of the encoder output (computed once), each
    ``[batch, source_len, kv_heads, head_dim]``."""

    decoder: DecodeState
    cross: tuple[tuple[jax.Array, jax.Array], ...]


class EncoderDecoderLM(nnx.Module):
    """``model.n_layers`` bidirectional encoder blocks and as many causal decoder blocks with
    cross-attention (see the module docstring)."""

    state_type = EncDecState

    def __init__(self, arch, *, rngs: nnx.Rngs):
        cfg = arch.cfg
        self.cfg, self.arch = cfg, arch
        self.encoder_encoding = arch.stack.encoding
        self.encoding = arch.decoder.encoding
        init = nnx.initializers.normal(cfg.init_std)
        self.token_embedding = nnx.Param(init(rngs.params(), (cfg.vocab_size, cfg.d_model)))
        self.position_embedding = self.encoder_encoding.init_params(rngs)
        self.decoder_position_embedding = self.encoding.init_params(rngs)
        self.encoder = nnx.List([layer.build(rngs) for layer in arch.stack.layers])
        self.encoder_norm = arch.norm(cfg.d_model, cfg.norm_eps)
        self.decoder = nnx.List([DecoderBlock(layer, rngs=rngs) for layer in arch.decoder.layers])
        self.final_norm = arch.norm(cfg.d_model, cfg.norm_eps)
        self.lm_head = (None if cfg.tie_embeddings
                        else nnx.Param(init(rngs.params(), (cfg.d_model, cfg.vocab_size))))
        self.head = arch.head.build(rngs)  # None for the linear and T5 heads

    def _embed(self, tokens, positions, encoding, table):
        x = jnp.take(self.token_embedding[...], tokens, axis=0)
        return encoding.embed(x, positions, table).astype(compute_dtype(self.cfg))

    def encode(self, source: jax.Array, *, dropout_rng=None) -> jax.Array:
        """``source int32 [batch, s]`` -> the encoder output ``[batch, s, d_model]``."""
        positions = np.arange(source.shape[1], dtype=np.int32)[None]
        self.encoder_encoding.check_range(positions)
        keys = dropout_keys(dropout_rng, len(self.encoder) + 1)
        x = self._embed(source, positions, self.encoder_encoding, self.position_embedding)
        x = dropout(x, self.cfg.dropout, keys[-1])
        for layer, (block, key) in enumerate(zip(self.encoder, keys)):
            bias = self.encoder_encoding.layer_bias(self.position_embedding, layer)
            x, _ = run_layer(block, self.cfg.remat, x, positions, bias=bias, dropout_key=key)
        return self.encoder_norm(x)

    def cross_keys_values(self, memory: jax.Array) -> tuple[tuple[jax.Array, jax.Array], ...]:
        """Every decoder layer's cross-attention keys/values of ``memory [batch, s, d]``."""
        return tuple(block.cross.keys_values(memory) for block in self.decoder)

    def logits(self, y: jax.Array) -> jax.Array:
        """``[batch, t, d_model] -> float32 [batch, t, vocab]`` (final norm, then the head;
        ``model.head=t5`` rescales by ``d_model^-0.5`` first)."""
        y = self.arch.head.hidden(self.head, self.final_norm(y))
        head = self.token_embedding[...].T if self.lm_head is None else self.lm_head[...]
        return self.arch.head.output(self.head, project(y, head.astype(y.dtype), jnp.float32))

    def _decoder(self, targets, positions, cross, *, states=None, start=0, dropout_rng=None):
        keys = dropout_keys(dropout_rng, len(self.decoder) + 1)
        y = self._embed(targets, positions, self.encoding, self.decoder_position_embedding)
        y = dropout(y, self.cfg.dropout, keys[-1])
        new_states = []
        for layer, (block, memory_kv, key) in enumerate(zip(self.decoder, cross, keys)):
            bias = self.encoding.layer_bias(self.decoder_position_embedding, layer)
            if states is None:  # training / teacher forcing: rematerialised per model.remat
                y, state = run_layer(block, self.cfg.remat, y, positions, memory_kv,
                                     bias=bias, dropout_key=key)
            else:
                y, state = block(y, positions, memory_kv, bias=bias, state=states[layer],
                                 start=start, dropout_key=key)
            new_states.append(state)
        return self.logits(y), new_states

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

    def decode(self, tokens, start, state: EncDecState):
        """Decoding step of the decoder: ``tokens int32 [batch, t]`` at positions ``start ..
        start + t - 1`` against ``state`` (:func:`attnlab.model.decoding.init_encdec_state`).

        Returns ``(logits float32 [batch, t, vocab], state)``."""
        t = tokens.shape[1]
        positions = (start + jnp.arange(t, dtype=jnp.int32))[None]
        logits, new = self._decoder(tokens, positions, state.cross,
                                    states=list(state.decoder.layers), start=start)
        return logits, EncDecState(state.decoder._replace(layers=tuple(new)), state.cross)
