"""Training objectives (``model.objective``): what the model reads, what it predicts, and which
stack of layers does it.

| objective | model | reads -> predicts | reference |
|---|---|---|---|
| ``clm`` | causal decoder | ``x[:-1] -> x[1:]`` (all) | Radford et al. 2018 |
| ``mlm`` | bidirectional encoder | BERT-masked ``x`` -> the 15% selected | Devlin et al. 2019, 3.1 |
| ``span`` | encoder-decoder | spans -> ``[MASK]``; writes ``[MASK] span ...`` | Raffel et al. 2020 |
| ``regression`` | causal decoder of vectors | prompt ``x_1, (y_1, 0..), ..`` -> ``y_j`` at ``x_j`` | Garg et al. 2022 |

Every window of the batch stream is ``seq_len + 1`` tokens; the masked objectives read its first
``seq_len`` (the same input tokens per step as the decoder). Corruption is drawn on the device in
the jitted step from ``jax.random`` keys that depend only on ``(data.seed, batch index,
micro-batch)`` (:func:`masking_key`), so batch ``i`` is corrupted identically after a restart and
on any number of devices.

The [MASK] id is the model's last id, ``model.vocab_size - 1`` (:func:`mask_id`): the config
checks that it lies past the tokenizer's vocabulary (byte: 257 ids, so [MASK] = 256). Span
corruption uses the same id as its one sentinel (T5 uses a distinct sentinel per span; the spans'
order already says which is which) and as the decoder's start token.

Adding an objective is one subclass of :class:`Objective` and one line in
``architecture.OBJECTIVES``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from attnlab.config import ModelConfig
from attnlab.errors import ConfigError
from attnlab.model.masks import Packing

MASK_TEXT = "[MASK]"  # how prompts and outputs write the [MASK] id
SELECT_RATE = 0.15  # BERT: positions selected for prediction (Devlin et al. 2019, 3.1)
MASK_SHARE, RANDOM_SHARE = 0.8, 0.1  # of the selected: [MASK], random token; the rest kept
NOISE_DENSITY = 0.15  # T5 span corruption: share of tokens in spans (Raffel et al. 2020)
MEAN_SPAN = 3.0  # T5: mean span length
_MASKING_SALT = 0x4D4C4D  # keeps the masking keys apart from the dropout keys of the same seed


def mask_id(vocab_size: int) -> int:
    """The [MASK] (and span sentinel) id: the model's last id."""
    return vocab_size - 1


def masking_key(seed: int, batch_index, micro: int | jax.Array = 0) -> jax.Array:
    """The key that corrupts micro-batch ``micro`` of batch ``batch_index`` (may be traced)."""
    root = jax.random.fold_in(jax.random.key(seed), _MASKING_SALT)
    return jax.random.fold_in(jax.random.fold_in(root, batch_index), micro)


def token_losses(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """Cross-entropy per token in nats: ``logsumexp(logits) - logits[target]``.

    Args:
      logits: ``[batch, seq, vocab]``.
      targets: int ``[batch, seq]``.

    Returns:
      float32 ``[batch, seq]``.
    """
    # logsumexp minus the target's logit: no [batch, seq, vocab] array of log-probabilities is
    # kept for the backward pass (log_softmax kept one, in float32, beside the logits).
    return optax.losses.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), targets.astype(jnp.int32))


# --------------------------------------------------------------------------------------------
# BERT masking (Devlin et al. 2019, section 3.1 and appendix A.1)
# --------------------------------------------------------------------------------------------


def bert_mask(tokens: jax.Array, key: jax.Array, mask: int, *, rate: float = SELECT_RATE
              ) -> tuple[jax.Array, jax.Array]:
    """Selects each position with probability ``rate``; a selected token becomes [MASK] with
    probability 0.8, a uniformly random real token (``0 .. mask - 1``, possibly itself) with 0.1,
    and stays with 0.1.

    Args:
      tokens: int32 ``[batch, seq]`` (ids below ``mask``).
      key: PRNG key (:func:`masking_key`).
      mask: the [MASK] id.

    Returns:
      ``(inputs int32 [batch, seq], selected bool [batch, seq])``: the loss is taken where
      ``selected``, against ``tokens``.
    """
    k_select, k_action, k_random = jax.random.split(key, 3)
    selected = jax.random.uniform(k_select, tokens.shape) < rate
    action = jax.random.uniform(k_action, tokens.shape)
    random_tokens = jax.random.randint(k_random, tokens.shape, 0, mask, jnp.int32)
    inputs = jnp.where(selected & (action < MASK_SHARE), mask, tokens)
    randomised = selected & (action >= MASK_SHARE) & (action < MASK_SHARE + RANDOM_SHARE)
    return jnp.where(randomised, random_tokens, inputs).astype(jnp.int32), selected


# --------------------------------------------------------------------------------------------
# T5 span corruption (Raffel et al. 2020, section 3.1.4; the random_spans_noise_mask rule)
# --------------------------------------------------------------------------------------------


def span_counts(seq_len: int) -> tuple[int, int]:
    """``(noise tokens, spans)`` of a ``seq_len``-token input: ``round(0.15 L)`` and
    ``round(noise / 3)``, each at least 1 (static, so every shape below is static)."""
    noise = min(max(1, round(seq_len * NOISE_DENSITY)), seq_len - 1)
    spans = max(1, min(round(noise / MEAN_SPAN), seq_len - noise))
    return noise, spans


def span_lengths(seq_len: int) -> tuple[int, int]:
    """``(encoder length, decoder length)`` after span corruption of ``seq_len`` tokens: the
    encoder reads ``L - noise + spans`` tokens (a sentinel per span), the decoder writes
    ``noise + spans`` (each span after its sentinel)."""
    noise, spans = span_counts(seq_len)
    return seq_len - noise + spans, noise + spans


def _random_partition(key: jax.Array, n: int, parts: int) -> jax.Array:
    """``n`` items cut into ``parts`` non-empty runs at uniformly random places; int32
    ``[parts]`` summing to ``n``."""
    cuts = jnp.sort(jax.random.permutation(key, n - 1)[: parts - 1] + 1)
    edges = jnp.concatenate([jnp.zeros(1, jnp.int32), cuts.astype(jnp.int32),
                             jnp.full(1, n, jnp.int32)])
    return jnp.diff(edges)


def _span_layout(key: jax.Array, length: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Where one row's noise spans lie: ``(is_noise, first, span)``, each ``[length]``: in a
    span, the span's first token, the span's index (T5: runs alternate kept, noise, kept, ...,
    kept first, each count cut at random places)."""
    noise, spans = span_counts(length)
    k_noise, k_kept = jax.random.split(key)
    lengths = jnp.stack([_random_partition(k_kept, length - noise, spans),
                         _random_partition(k_noise, noise, spans)], axis=1).reshape(-1)
    ends = jnp.cumsum(lengths)
    index = jnp.arange(length)
    segment = jnp.searchsorted(ends, index, side="right")
    is_noise = segment % 2 == 1
    first = is_noise & (index == (ends - lengths)[segment])
    return is_noise, first, segment // 2


def _corrupt_spans_row(tokens: jax.Array, key: jax.Array, mask: int
                       ) -> tuple[jax.Array, jax.Array]:
    """One row: ``tokens [L]`` -> ``(encoder input [L_enc], decoder target [L_dec])``."""
    enc_len, dec_len = span_lengths(tokens.shape[0])
    is_noise, first, span = _span_layout(key, tokens.shape[0])
    keep = ~is_noise | first  # a span's first token becomes its sentinel, the rest vanish
    enc_slot = jnp.where(keep, jnp.cumsum(keep) - 1, enc_len)
    encoder = jnp.zeros(enc_len, jnp.int32).at[enc_slot].set(
        jnp.where(is_noise, mask, tokens), mode="drop")
    # span k's tokens follow the earlier spans' tokens and k + 1 sentinels
    dec_slot = jnp.cumsum(is_noise) - 1 + span + 1
    target = jnp.zeros(dec_len, jnp.int32).at[jnp.where(is_noise, dec_slot, dec_len)].set(
        tokens, mode="drop")
    target = target.at[jnp.where(first, dec_slot - 1, dec_len)].set(mask, mode="drop")
    return encoder, target


def span_noise(tokens: jax.Array, key: jax.Array) -> jax.Array:
    """bool ``[batch, seq]``: the tokens :func:`corrupt_spans` with the same ``key`` puts in
    spans."""
    keys = jax.random.split(key, tokens.shape[0])
    return jax.vmap(lambda k: _span_layout(k, tokens.shape[1])[0])(keys)


def corrupt_spans(tokens: jax.Array, key: jax.Array, mask: int) -> tuple[jax.Array, jax.Array]:
    """T5 span corruption of each row: ``round(0.15 L)`` noise tokens in ``round(noise / 3)``
    spans at random places (mean length 3); each span is replaced by one [MASK] sentinel in
    the encoder input, and the target lists ``[MASK] span`` for every span in order.

    Args:
      tokens: int32 ``[batch, seq]``.

    Returns:
      ``(encoder int32 [batch, enc_len], target int32 [batch, dec_len])`` (:func:`span_lengths`).
    """
    keys = jax.random.split(key, tokens.shape[0])
    return jax.vmap(_corrupt_spans_row, in_axes=(0, 0, None))(tokens, keys, mask)


def decoder_inputs(target: jax.Array, start: int) -> jax.Array:
    """Teacher forcing: ``[start] + target[:-1]``; int32 ``[batch, dec_len]``."""
    first = jnp.full((target.shape[0], 1), start, jnp.int32)
    return jnp.concatenate([first, target[:, :-1]], axis=1)


# --------------------------------------------------------------------------------------------
# The objectives
# --------------------------------------------------------------------------------------------


class Scores(NamedTuple):
    """Sums over the predicted positions of a batch: ``loss`` (nats), ``correct`` (argmax hits)
    and ``count`` (positions scored)."""

    loss: jax.Array
    correct: jax.Array
    count: jax.Array


def _scores(logits: jax.Array, targets: jax.Array, weights: jax.Array) -> Scores:
    weights = weights.astype(jnp.float32)
    hits = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
    return Scores((token_losses(logits, targets) * weights).sum(), (hits * weights).sum(),
                  weights.sum())


@dataclasses.dataclass(frozen=True)
class Objective:
    """One training objective of a model built from ``cfg`` (immutable, hashable).

    Class attributes: ``name`` (the ``model.objective`` value), ``causal`` (the self-attention
    of the stack that reads the input is causal), ``encoder_decoder`` (a second, decoding stack
    with cross-attention), ``uses_mask`` (needs the [MASK] id), ``reads_vectors`` (trained on
    prompts of real vectors, not token windows), ``weights_targets`` (scores each next-token
    target with a weight: ``data.loss_on``).
    """

    cfg: ModelConfig = dataclasses.field(repr=False)

    name = ""
    title = ""
    causal = True
    encoder_decoder = False
    uses_mask = False
    reads_vectors = False  # its batches are prompts of real vectors (model.inputs=vectors)
    weights_targets = False  # its loss takes a weight per next-token target (data.loss_on)
    loss_unit = "nats/token"  # what its loss measures
    mup_rule = True  # model.parameterization=mup is implemented for it
    fields = ()

    def validate(self, layers, mask) -> None:
        """Rules between the objective and the input stack's resolved parts: its ``layers``
        (block kinds with their mixers) and the decoder's ``mask`` (raises ConfigError naming
        the field)."""

    def predicted_per_input(self, seq_len: int) -> float:
        """Predicted (scored) tokens per input token, in expectation."""
        return 1.0

    def uninformed_loss(self) -> tuple[float, str]:
        """The loss of a model that has learned nothing, and what such a model predicts: the
        reference an untrained model's loss is read against (``model-info --forward``)."""
        vocab = self.cfg.vocab_size
        return math.log(vocab), f"uniform over the vocabulary: ln {vocab}"

    def scores(self, model, tokens: jax.Array, key: jax.Array, *, dropout_rng=None,
               packing: Packing | None = None, weights=None) -> Scores:
        """Scores of ``model`` on windows ``tokens int32 [batch, seq_len + 1]``, corrupted with
        ``key``; dropout iff ``dropout_rng``; with ``packing`` (``data.document_mask``) each
        token sees only its own document. ``weights [seq_len]`` (the causal objective only):
        each target's weight, e.g. a task's answers alone (``data.loss_on``); None: all 1."""
        raise NotImplementedError

    def span_scores(self, model, tokens: jax.Array, key: jax.Array, *,
                    packing: Packing | None = None) -> Scores:
        """The common measure of the objectives (``train.eval_masked_spans``): the tokens
        ``x = tokens[:, 1:]`` that T5's span corruption with ``key`` hides (:func:`span_noise`)
        scored by the model in its own way: the decoder from their left context, the encoder
        with every span [MASK]ed (each token on its own), the encoder-decoder by its decoder
        (sentinels not counted). Same tokens for all three."""
        raise NotImplementedError


def _no_weights(objective: str, weights) -> None:
    """Per-target weights are defined for next-token targets only (config refuses the rest)."""
    if weights is not None:
        raise ValueError(f"model.objective={objective} takes no per-target weights")


class CausalLM(Objective):
    """Next-token prediction with a causal decoder: position ``j`` predicts token ``j + 1``."""

    name = "clm"
    weights_targets = True
    title = "causal LM (decoder)"

    def scores(self, model, tokens, key, *, dropout_rng=None, packing=None, weights=None):
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        logits = model(inputs, **_packed(inputs, packing), deterministic=dropout_rng is None,
                       dropout_rng=dropout_rng)
        weights = jnp.ones(targets.shape[-1]) if weights is None else jnp.asarray(weights)
        return _scores(logits, targets, jnp.broadcast_to(weights, targets.shape))

    def span_scores(self, model, tokens, key, *, packing=None):
        x, inputs = tokens[:, 1:], tokens[:, :-1]
        return _scores(model(inputs, **_packed(inputs, packing)), x, span_noise(x, key))


def _packed(tokens: jax.Array, packing: Packing | None) -> dict:
    """The ``positions`` and ``segments`` to call a model on ``tokens`` with (the separators
    read from the uncorrupted tokens); none without ``packing``."""
    if packing is None:
        return {}
    segments, positions = packing.inputs(tokens)
    return {"positions": positions, "segments": segments}


def _needs_bidirectional(objective: str, layers, mask) -> None:
    """An encoder's attention sees both sides: every causal-only part is refused."""
    cfg = layers[0].cfg
    if not all(layer.mixer.forms_scores for layer in layers):
        raise ConfigError("model.objective",
                          f"{objective} needs bidirectional softmax attention; model.mixer="
                          f"{cfg.mixer} (attention_every={cfg.attention_every}) is causal-only "
                          "here")
    if not mask.is_causal:
        raise ConfigError("model.objective",
                          f"{objective} needs bidirectional attention; {mask.setting()} is a "
                          f"causal {mask.title}")
    if layers[0].causal_only:
        raise ConfigError("model.objective", f"{objective} is not built for {layers[0].title} "
                                             f"blocks ({layers[0].setting()} is decoder-only)")


class MaskedLM(Objective):
    """BERT's masked LM (:func:`bert_mask`): a bidirectional encoder predicts the selected
    tokens; loss and accuracy on the selected positions only."""

    name = "mlm"
    title = "masked LM (encoder)"
    causal = False
    uses_mask = True

    def validate(self, layers, mask):
        _needs_bidirectional(self.name, layers, mask)

    def predicted_per_input(self, seq_len):
        return SELECT_RATE

    def scores(self, model, tokens, key, *, dropout_rng=None, packing=None, weights=None):
        _no_weights(self.name, weights)
        targets = tokens[:, :-1]
        inputs, selected = bert_mask(targets, key, mask_id(self.cfg.vocab_size))
        logits = model(inputs, **_packed(targets, packing), deterministic=dropout_rng is None,
                       dropout_rng=dropout_rng)
        return _scores(logits, targets, selected)

    def span_scores(self, model, tokens, key, *, packing=None):
        x = tokens[:, 1:]
        noise = span_noise(x, key)
        inputs = jnp.where(noise, mask_id(self.cfg.vocab_size), x)
        return _scores(model(inputs, **_packed(x, packing)), x, noise)


class SpanCorruption(Objective):
    """T5's span corruption (:func:`corrupt_spans`) with an encoder-decoder: the encoder reads
    the corrupted input, the causal decoder writes the spans, cross-attending to it."""

    name = "span"
    title = "span corruption (encoder-decoder)"
    causal = False
    encoder_decoder = True
    uses_mask = True
    mup_rule = False  # the cross-attention's scale is not the parameterisation's (not built)

    def validate(self, layers, mask):
        _needs_bidirectional(self.name, layers, mask)
        if not layers[0].pre_norm:
            raise ConfigError("model.norm_position",
                              "model.objective=span builds pre-LN encoder-decoder blocks only")
        scale = layers[0].mixer.score_scale
        if scale.param_count():
            raise ConfigError("model.attention_scale",
                              f"{scale.name} learns a temperature per self-attention layer, which "
                              "the encoder-decoder's cross-attention does not have; use rsqrt, "
                              "mup or none (T5's unscaled scores)")
        if self.cfg.qk_norm:
            raise ConfigError("model.qk_norm", "the encoder-decoder's cross-attention has no "
                                               "QK-norm (model.objective=span)")

    def predicted_per_input(self, seq_len):
        return span_lengths(seq_len)[1] / seq_len

    def scores(self, model, tokens, key, *, dropout_rng=None, packing=None, weights=None):
        _no_weights(self.name, weights)
        mask = mask_id(self.cfg.vocab_size)
        encoder, target = corrupt_spans(tokens[:, :-1], key, mask)
        logits = model(encoder, decoder_inputs(target, mask),
                       deterministic=dropout_rng is None, dropout_rng=dropout_rng)
        return _scores(logits, target, jnp.ones(target.shape))

    def span_scores(self, model, tokens, key, *, packing=None):
        mask = mask_id(self.cfg.vocab_size)
        encoder, target = corrupt_spans(tokens[:, 1:], key, mask)
        return _scores(model(encoder, decoder_inputs(target, mask)), target, target != mask)


class InContextRegression(Objective):
    """In-context linear regression (Garg et al. 2022, section 3): a causal decoder of vectors
    (``model.inputs=vectors``) reads the prompt ``z = x_1, (y_1, 0..), .., x_k, (y_k, 0..)``
    and its read-out at ``x_j``'s position predicts ``y_j`` from the ``j - 1`` examples before
    it. The loss is the squared error ``sum_j m_j (yhat_j - y_j)^2 / sum_j m_j`` over the scored
    examples ``m_j`` (the curriculum's,
    :meth:`attnlab.data.icl_regression.RegressionTask.window`)."""

    name = "regression"
    title = "in-context regression (squared error)"
    reads_vectors = True
    loss_unit = "squared error per y"
    mup_rule = False  # the vector read-in and read-out have no muP rule

    def predicted_per_input(self, seq_len):
        return 0.5  # one y per (x, y) pair

    def uninformed_loss(self):
        # E[(w.x)^2] = E[|w|^2] = d for w, x ~ N(0, I_d) (plus the noise's variance, if any)
        d = self.cfg.input_dim
        return float(d), "predicting 0, without noise: E[y^2] = d"

    def scores(self, model, tokens, key, *, dropout_rng=None, packing=None, weights=None):
        """``tokens``: float ``[batch, 2k, d + 1]``, the prompt in channels ``:d`` and the
        weights of the ``x`` positions in channel ``d``. ``Scores.loss`` sums squared errors
        (not nats); ``correct`` is 0 (nothing to count)."""
        _no_weights(self.name, weights)
        prompt, scored = tokens[..., :-1], tokens[:, 0::2, -1]
        predictions = model(prompt, deterministic=dropout_rng is None,
                            dropout_rng=dropout_rng)[:, 0::2]  # [batch, k]: at every x_j
        squared = (predictions - prompt[:, 1::2, 0].astype(jnp.float32)) ** 2
        return Scores((squared * scored).sum(), jnp.zeros(()), scored.sum())

    def span_scores(self, model, tokens, key, *, packing=None):
        raise ValueError("in-context regression has no token spans to score")
