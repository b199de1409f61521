"""The single-stack Transformer LM (Flax NNX), used functionally: the decoder-only LM and the
BERT-style encoder (:class:`TransformerLM`, causal or not by ``model.objective``); the T5-style
encoder-decoder is ``encoder_decoder.py``.

The model is built once from its resolved :class:`~attnlab.model.architecture.Architecture` and
split into a static ``GraphDef`` and a ``State`` of float32 parameters (:func:`init_model`);
:func:`apply` is a pure function of that state, safe to wrap in
``jax.jit(lambda state, tokens: apply(graphdef, state, tokens))``. Nothing mutates module state
inside jit (dropout takes an explicit key).

    x = encoding.embed(E[tokens], positions)   (adds P[positions] for learned / sinusoidal)
    x = block(x) for each layer                (the block kind: pre-LN, post-LN, nGPT)
    logits = FinalNorm(x) W_head               (pre-LN's final norm), W_head = E^T when tied
    (model.head: BERT's transform and output bias, T5's d_model^-0.5; heads.py)
    (muP, ``model.parameterization``: hidden weights drawn at std / sqrt(fan_in multiplier) and
    the logits times 1 / width multiplier; attnlab/model/parameterization.py)

``model.scan_layers``: the stack is held as ONE block whose parameters carry a leading
``[n_layers, ...]`` axis and is run by ``jax.lax.scan``, so the step is traced once per layer
*body*, not once per layer (trace and compile time flat in depth). The stacked parameters are the
unrolled model's, stacked: the same seed gives the same model either way. ``model.remat``: each
layer's forward is wrapped in ``jax.checkpoint`` (:data:`attnlab.model.layers.REMAT_POLICIES`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from attnlab.config import ModelConfig
from attnlab.model.architecture import Architecture, resolve
from attnlab.model.blocks import dropout_keys, layer_slice, run_layer, stack_layers
from attnlab.model.decoding import DecodeState
from attnlab.model.encoder_decoder import EncoderDecoderLM
from attnlab.model.layers import compute_dtype, dense, dropout, project
from attnlab.model.masks import continued_documents, documents_from_segments
from attnlab.model import readin
from attnlab.model.parameterization import path_name
from attnlab.model.positions import check_positions

DECODE_STATE = "KV cache"  # how range errors name the decode state's positions


def positions_for(positions, batch: int, seq: int) -> jax.Array:
    """Positions as int32 ``[pbatch, seq]`` (default ``arange(seq)``, concrete so that range
    checks happen at trace time); ``[seq]`` is accepted."""
    if positions is None:
        positions = np.arange(seq, dtype=np.int32)[None]
    elif not isinstance(positions, jax.core.Tracer):
        positions = np.asarray(positions)
    if positions.ndim == 1:
        positions = positions[None]
    if positions.ndim != 2 or positions.shape[1] != seq or positions.shape[0] not in (1, batch):
        raise ValueError(
            f"positions must have shape [seq] or [batch, seq] = [{batch}, {seq}], "
            f"got {tuple(positions.shape)}"
        )
    return positions


class TransformerLM(nnx.Module):
    """One stack of layers with an LM head: a causal decoder, or (for an objective whose input
    stack is not causal, ``mlm``) a bidirectional encoder. Built from its resolved parts."""

    def __init__(self, arch: Architecture, *, rngs: nnx.Rngs):
        cfg = arch.cfg
        self.cfg, self.arch = cfg, arch
        self.encoding = arch.stack.encoding
        init = nnx.initializers.normal(cfg.init_std)
        self.token_embedding = nnx.Param(init(rngs.params(), (cfg.vocab_size, cfg.d_model)))
        # The encoding's table (learned positions, T5's bias; None for the others) keeps this
        # attribute name: it is the parameter path in checkpoints.
        self.position_embedding = self.encoding.init_params(rngs)
        # BERT / Bloom: a norm of the summed embeddings (no random draw: the RNG order stays).
        self.embedding_norm = (arch.norm(cfg.d_model, cfg.norm_eps) if cfg.embedding_norm
                               else None)
        blocks = [layer.build(rngs) for layer in arch.stack.layers]
        # scan_layers: the same layers (same RNG draws), stacked: parameters [n_layers, ...].
        self.blocks = stack_layers(blocks) if cfg.scan_layers else nnx.List(blocks)
        self.final_norm = (arch.norm(cfg.d_model, cfg.norm_eps) if arch.block.final_norm
                           else None)
        self.lm_head = (None if cfg.tie_embeddings
                        else nnx.Param(init(rngs.params(), (cfg.d_model, cfg.vocab_size))))
        self.logit_scale = arch.block.head_scale(rngs)  # nGPT's s_z; None for the others
        # model.head=bert: its transform and output bias (attnlab/model/heads.py); else None.
        self.head = arch.head.build(rngs)
        constraint = arch.block.param_constraint()
        if constraint is not None:  # nGPT: every matrix starts with unit rows
            nnx.update(self, constraint(nnx.state(self, nnx.Param)))
        scale_init(self, arch.parameterization)

    def embed(self, tokens: jax.Array, positions: jax.Array) -> jax.Array:
        """``tokens [batch, seq]``, ``positions [pbatch, seq]`` -> ``[batch, seq, d_model]``."""
        x = jnp.take(self.token_embedding[...], tokens, axis=0)
        x = self.encoding.embed(x, positions, self.position_embedding)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        return x.astype(compute_dtype(self.cfg))

    def logits(self, x: jax.Array) -> jax.Array:
        """``[batch, seq, d_model] -> float32 [batch, seq, vocab]`` (final norm for pre-LN)."""
        if self.final_norm is not None:
            x = self.final_norm(x)
        x = self.arch.head.hidden(self.head, x)  # BERT's transform, T5's rescale
        head = self.token_embedding[...].T if self.lm_head is None else self.lm_head[...]
        logits = project(x, head.astype(x.dtype), jnp.float32)  # "bsd,dv->bsv"
        logits = self.arch.head.output(self.head, logits)  # BERT's output bias
        multiplier = self.arch.parameterization.logit_multiplier()
        if multiplier is not None:  # muP: 1 / width multiplier (Tensor Programs V, Table 8)
            logits = logits * multiplier
        return logits if self.logit_scale is None else logits * self.logit_scale()

    def bias(self, layer):
        """Layer ``layer``'s score bias (the encoding's, bound to its table), or None."""
        return self.encoding.layer_bias(self.position_embedding, layer)

    def __call__(self, tokens, positions=None, *, segments=None, deterministic: bool = True,
                 dropout_rng=None):
        """Logits of every position.

        Args:
          tokens: int32 ``[batch, seq]``.
          positions: int32 ``[seq]`` or ``[batch, seq]``; default ``arange(seq)``.
          segments: int ``[batch, seq]``, each token's document (runs of equal ids,
            :func:`~attnlab.model.masks.segment_ids`), or None: a token attends to (and a
            recurrent state carries) only tokens of its own document.
          deterministic: no dropout. When False and ``model.dropout > 0``, ``dropout_rng`` is
            required.

        Returns:
          float32 ``[batch, seq, vocab]``.
        """
        batch, seq = tokens.shape[:2]  # [batch, seq] ids ([batch, seq, dim] vectors)
        documents = None if segments is None else documents_from_segments(segments)
        positions = positions_for(positions, batch, seq)
        self.encoding.check_range(positions)
        positions = jnp.asarray(positions, jnp.int32)
        use_dropout = not deterministic and self.cfg.dropout > 0
        if use_dropout and dropout_rng is None:
            raise ValueError(
                "dropout is on (deterministic=False, model.dropout > 0): pass dropout_rng")
        n_layers = self.cfg.n_layers
        keys = dropout_keys(dropout_rng if use_dropout else None, n_layers + 1)
        x = dropout(self.embed(tokens, positions), self.cfg.dropout, keys[-1])
        if self.cfg.scan_layers:  # layer i draws keys[i], as unrolled
            layer_keys = jax.random.split(dropout_rng, n_layers + 1)[:-1] if use_dropout else None
            return self.logits(self._scan_layers(x, positions, layer_keys, documents))
        for layer, (block, key) in enumerate(zip(self.blocks, keys)):
            x, _ = run_layer(block, self.cfg.remat, x, positions, bias=self.bias(layer),
                             documents=documents, dropout_key=key)
        return self.logits(x)

    def _scan_layers(self, x, positions, keys, documents=None):
        """The stacked layers over ``x [batch, seq, d_model]`` by one ``jax.lax.scan``;
        ``keys``: the layers' dropout keys ``[n_layers]`` or None. The encoding's bias is bound
        per layer by a traced index (T5's per-layer table is sliced)."""
        graphdef, stacked = nnx.split(self.blocks)
        table = None if self.position_embedding is None else self.position_embedding[...]
        encoding, remat = self.encoding, self.cfg.remat

        def body(x, inputs):
            state, key, layer = inputs
            block = nnx.merge(graphdef, state)
            x, _ = run_layer(block, remat, x, positions, bias=encoding.layer_bias(table, layer),
                             documents=documents, dropout_key=key)
            return x, nnx.pop(block, nnx.Intermediate)  # what the layer recorded leaves too

        layers = jnp.arange(self.cfg.n_layers, dtype=jnp.int32)
        x, recorded = jax.lax.scan(body, x, (stacked, keys, layers))
        nnx.update(self.blocks, recorded)  # [n_layers, ...]: the stacked layer's records
        return x

    def layers(self) -> list[nnx.Module]:
        """Every layer as its own block (a stacked model's are slices of the stacked
        parameters)."""
        if self.cfg.scan_layers:
            return [layer_slice(self.blocks, i) for i in range(self.cfg.n_layers)]
        return list(self.blocks)

    def decode(self, tokens, start, state: DecodeState, *, segments=None,
               reset_positions: bool = False, offsets=None, check_range: bool = True):
        """Decoding step: ``t`` new tokens at sequence indices ``start .. start + t - 1``.

        Args:
          tokens: int32 ``[batch, t]``.
          start: int or traced int: how many tokens the decode state already holds.
          state: :class:`~attnlab.model.decoding.DecodeState`.
          segments: int ``[batch, t]``, the new tokens' document ids, numbered on from the
            earlier steps' (:func:`~attnlab.model.masks.segment_ids` of the whole sequence), or
            None (no document mask). A token whose id differs from the one before starts a
            document: it and later tokens see nothing before it.
          reset_positions: positions restart at each document (``data.reset_positions``);
            else positions are the indices minus ``offsets``.
          offsets: int ``[batch]``, each row's first real index (left padding: its pad
            length), or None (0); positions before it (the pads') are clamped to 0.
          check_range: verify that ``start + t`` fits the state and the encoding (callers
            that have checked the whole generation statically pass False).

        Returns:
          ``(logits float32 [batch, t, vocab], state)``.
        """
        if not self.arch.objective.causal:
            raise ValueError(f"model.objective={self.cfg.objective} is a bidirectional encoder: "
                             "it has no KV-cache decoding (fill masks instead)")
        t = tokens.shape[1]
        documents = None
        if segments is not None:
            segments = jnp.asarray(segments, jnp.int32)
            documents = continued_documents(segments, start, state.segment, state.document_start)
            state = state._replace(segment=segments[:, -1], document_start=documents.start[:, -1])
        if isinstance(start, jax.core.Tracer):
            indices = (start + jnp.arange(t, dtype=jnp.int32))[None]
        else:
            indices = (int(start) + np.arange(t, dtype=np.int32))[None]
        positions = indices
        if reset_positions and documents is not None:
            positions = indices - documents.start
        elif offsets is not None:
            positions = jnp.maximum(indices - jnp.asarray(offsets, jnp.int32)[:, None], 0)
        if check_range:
            # Attention layers hold their cache's indices; recurrent states any.
            lengths = [mixer.state_length(layer_state) for mixer, layer_state
                       in zip(self.arch.stack.mixers, state.layers)]
            lengths = [n for n in lengths if n is not None]
            if lengths:
                check_positions(indices, min(lengths), DECODE_STATE)
            self.encoding.check_range(positions)
        positions = jnp.asarray(positions, jnp.int32)
        x = self.embed(tokens, positions)
        # A stacked model decodes layer by layer too (slices of its parameters): decoding is
        # not differentiated, and the per-layer states stay where they are.
        new = []
        for layer, (block, layer_state) in enumerate(zip(self.layers(), state.layers)):
            x, layer_state = block(x, positions, bias=self.bias(layer), documents=documents,
                                   state=layer_state, start=start)
            new.append(layer_state)
        return self.logits(x), state._replace(layers=tuple(new))


class VectorTransformer(TransformerLM):
    """The decoder stack of :class:`TransformerLM` between a linear read-in and a scalar
    read-out (``model.inputs=vectors``); called, and decoded, as the LM is, with vectors
    ``[batch, seq, input_dim]`` in place of ids, returning float32 ``[batch, seq]``."""

    def __init__(self, arch, *, rngs: nnx.Rngs):
        cfg = arch.cfg
        self.cfg, self.arch = cfg, arch
        self.encoding = arch.stack.encoding
        self.read_in = dense(cfg, cfg.input_dim, cfg.d_model, cfg.init_std, rngs, bias=True)
        self.position_embedding = self.encoding.init_params(rngs)
        blocks = [layer.build(rngs) for layer in arch.stack.layers]
        self.blocks = stack_layers(blocks) if cfg.scan_layers else nnx.List(blocks)
        self.final_norm = (arch.norm(cfg.d_model, cfg.norm_eps) if arch.block.final_norm
                           else None)
        self.read_out = dense(cfg, cfg.d_model, 1, cfg.init_std, rngs, bias=True)
        self.logit_scale = None

    def embed(self, inputs: jax.Array, positions: jax.Array) -> jax.Array:
        """``inputs [batch, seq, input_dim]`` -> ``[batch, seq, d_model]``."""
        x = self.read_in(jnp.asarray(inputs, compute_dtype(self.cfg)))
        return self.encoding.embed(x.astype(jnp.float32), positions,
                                   self.position_embedding).astype(compute_dtype(self.cfg))

    def logits(self, x: jax.Array) -> jax.Array:
        """``[batch, seq, d_model] -> float32 [batch, seq]``: the read-out."""
        if self.final_norm is not None:
            x = self.final_norm(x)
        return self.read_out(x)[..., 0].astype(jnp.float32)


# The single-stack module of each read-in kind (``model.inputs``, attnlab/model/readin.py).
INPUT_MODULES = {readin.Tokens: TransformerLM, readin.Vectors: VectorTransformer}


def scale_init(model: nnx.Module, parameterization) -> None:
    """Multiplies each freshly drawn parameter by its parameterisation's init factor (1 for
    the standard one: nothing is touched)."""
    params = nnx.state(model, nnx.Param)
    scales = parameterization.init_scales(params, param_shapes)
    if any(s != 1.0 for s in jax.tree.leaves(scales)):
        nnx.update(model, jax.tree.map(lambda p, s: p if s == 1.0 else p * s, params, scales))


def model_class(arch: Architecture) -> type[nnx.Module]:
    """The module ``arch`` builds: the encoder-decoder for an objective that has one, otherwise
    the single stack (decoder or encoder) of its read-in kind."""
    return EncoderDecoderLM if arch.decoder is not None else INPUT_MODULES[type(arch.inputs)]


class ParamKeys:
    """The parameters' keys of one model build, drawn as ``nnx.Rngs(params=seed)`` draws them:
    the ``i``-th call of ``params()`` is ``fold_in(key, i)`` (the same numbers, so the same
    model), with ``i`` counted in Python.

    Why not ``nnx.Rngs``: it keeps its count as a JAX value, and under a trace (``eval_shape``,
    the init program's ``jit``) every draw updates that traced count, for which flax asks the
    tracer for its sharding; JAX answers with an error message that walks the whole trace so
    far. Building a model was then quadratic in the number of draws (a 400-layer model took
    minutes of CPU before anything was checked); a Python count keeps it linear.
    """

    def __init__(self, seed):
        """``seed``: an int, a typed PRNG key or raw ``uint32`` key data (as ``nnx.Rngs``)."""
        if isinstance(seed, (int, np.integer)):
            seed = jax.random.key(int(seed))
        elif not jnp.issubdtype(seed.dtype, jax.dtypes.prng_key):
            seed = jax.random.wrap_key_data(seed)
        self.key, self.count = seed, 0

    def params(self) -> jax.Array:
        key = jax.random.fold_in(self.key, self.count)
        self.count += 1
        return key


def build_model(cfg: ModelConfig, rngs: nnx.Rngs | ParamKeys) -> nnx.Module:
    """The model of ``cfg`` (resolved once), parameters drawn from ``rngs`` (its ``params``
    stream is the only one used)."""
    arch = resolve(cfg)
    return model_class(arch)(arch, rngs=rngs)


def init_model(cfg: ModelConfig, seed) -> tuple[nnx.GraphDef, nnx.State]:
    """Builds the model and splits it once into ``(graphdef, state)``; ``state`` holds only the
    float32 ``nnx.Param`` leaves. ``seed``: an int or a PRNG key."""
    return nnx.split(build_model(cfg, ParamKeys(seed)))


def apply(graphdef: nnx.GraphDef, state: nnx.State, tokens, positions=None, *, dropout_rng=None):
    """Pure forward pass of a single-stack model: float32 logits ``[batch, seq, vocab]``.

    Dropout is applied (at ``model.dropout``) iff ``dropout_rng`` is given. Jit with the graphdef
    closed over or static.
    """
    model = nnx.merge(graphdef, state)
    return model(tokens, positions, deterministic=dropout_rng is None, dropout_rng=dropout_rng)


@functools.lru_cache(maxsize=64)
def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """``{path: shape}`` of every parameter of the model ``cfg`` builds (traced, nothing
    allocated); paths as :func:`attnlab.model.parameterization.path_name` writes them."""
    model = nnx.eval_shape(lambda: build_model(cfg, ParamKeys(0)))
    state = nnx.state(model, nnx.Param)
    return {path_name(p): tuple(x.shape) for p, x in jax.tree_util.tree_leaves_with_path(state)}
