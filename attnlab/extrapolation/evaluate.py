"""Evaluating a trained run at context lengths other than the one it was trained on.

    settings = EvalSettings(multipliers=(1, 2, 4, 8, 16), protocols=("nonoverlapping",))
    report = evaluate_run("runs/rope", settings)     # also writes extrapolation.json / .csv
    report["results"]                                # one row per (protocol, length)

Every encoding is evaluated zero-shot: positions simply continue past the training length
(``arange(L)``). A learned absolute position table has no rows beyond ``model.max_len``, so those
lengths are reported as not applicable, with the reason; they are never clamped (plain JAX
indexing would clamp silently, a flax embedding lookup would give NaN).

Optional RoPE context extension, applied only when asked and recorded in the report and in the
output file names. The encoding owns its rescalings (``RoPE.rescalings`` in
``attnlab/model/rope.py``); this module asks ``architecture.rescaled(cfg, method, factor)`` for the
evaluation config. ``ntk`` ("NTK-aware" scaling, bloc97 2023; eq. in Peng et al. 2023, YaRN
sec. 3.2) raises the RoPE base to ``theta * s^(d/(d-2))`` so that the lowest frequency is
interpolated by ``s`` while the highest is left almost unchanged; ``pi`` (position
interpolation, Chen et al. 2023) divides every frequency by ``s``; ``yarn`` (Peng et al. 2023)
interpolates only the wavelengths longer than the training context (a ramp between
``L/32`` and ``L``) and multiplies q and k by ``0.1 ln s + 1``.

Long windows use the model's query-block attention (``model.attention_chunk``), so no
``[heads, T, T]`` score tensor is ever built for long ``T``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any, Callable

import jax
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

import attnlab
from attnlab import model as lm
from attnlab import rundir
from attnlab.config import Config, ModelConfig
from attnlab.extrapolation import protocol
from attnlab.extrapolation.protocol import EvaluationError, WindowPlan
from attnlab.extrapolation.reports import (FORMAT_VERSION, checkpoint_fingerprint, is_current,
                                           latest_checkpoint_step, report_paths, settings_record,
                                           write_report)
from attnlab.model.positions import UNSCALED, RescalingError
from attnlab.model.rope import RoPE, ntk_rope_theta  # noqa: F401  (re-exported by extrapolation)

ROPE_SCALINGS = tuple(RoPE.rescalings)  # none, ntk, pi, yarn
EVERY_SCALING = "all"  # a study evaluates RoPE runs under every one of ROPE_SCALINGS
SPLIT = "validation"


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """What to evaluate and how. Lengths are ``multipliers x L_train`` unless ``lengths`` is given;
    L_train (``data.seq_len`` of the run) is always evaluated too, as the reference of r(k)."""

    multipliers: tuple[int, ...] = (1, 2, 4, 8, 16)
    lengths: tuple[int, ...] = ()  # absolute lengths; when given, multipliers are ignored
    protocols: tuple[str, ...] = ("nonoverlapping",)
    stride: int = 0  # sliding protocol; 0 -> half the shortest evaluated length
    max_tokens: int = 0  # > 0: use only the first max_tokens tokens of the validation split
    batch_tokens: int = 16384  # tokens per forward pass: windows per batch = batch_tokens // L
    attention_chunk: int = 512  # query-block size used for lengths above it; 0 -> never
    rope_scaling: str = "none"  # none | ntk | pi | yarn (RoPE runs only); a study also takes all
    rope_factor: float = 0.0  # s of the RoPE scaling; 0 -> longest length / L_train

    def validate(self) -> None:
        """Raises EvaluationError naming the first bad setting."""
        if not self.lengths:
            protocol.validate_lengths(self.multipliers, field="multipliers")
        else:
            protocol.validate_lengths(self.lengths, field="lengths")
        if not self.protocols:
            raise EvaluationError("protocol: no protocol given")
        for name in self.protocols:
            protocol.protocol_named(name)
        _check_int("stride", self.stride, 0)
        _check_int("max_tokens", self.max_tokens, 0)
        _check_int("batch_tokens", self.batch_tokens, 1)
        _check_int("attention_chunk", self.attention_chunk, 0)
        if self.rope_scaling not in (*ROPE_SCALINGS, EVERY_SCALING):
            raise EvaluationError(f"rope_scaling: unknown {self.rope_scaling!r}; valid values are "
                                  f"{', '.join((*ROPE_SCALINGS, EVERY_SCALING))}")
        if not (math.isfinite(self.rope_factor) and self.rope_factor >= 0):
            raise EvaluationError(f"rope_factor: must be >= 0 (0 = automatic), got "
                                  f"{self.rope_factor}")
        if self.rope_factor and self.rope_scaling == UNSCALED:
            raise EvaluationError("rope_factor: set only with --rope_scaling "
                                  f"({', '.join(ROPE_SCALINGS[1:])})")

    def resolve_lengths(self, train_length: int, *, include_train_length: bool = True
                        ) -> tuple[int, ...]:
        """Sorted evaluation lengths, including ``train_length`` (the reference of r(k)) unless
        ``include_train_length`` is False."""
        if self.lengths:
            lengths = protocol.validate_lengths(self.lengths, field="lengths")
        else:
            multipliers = protocol.validate_lengths(self.multipliers, field="multipliers")
            lengths = tuple(m * train_length for m in multipliers)
        return tuple(sorted({*lengths, *([train_length] if include_train_length else [])}))

    def resolve_stride(self, lengths: tuple[int, ...]) -> int:
        """The sliding stride; raises EvaluationError if it exceeds the shortest window."""
        stride = self.stride or max(1, min(lengths) // 2)
        if stride > min(lengths):
            raise EvaluationError(
                f"stride: {stride} is larger than the window length {min(lengths)} (the shortest "
                "evaluated length); tokens between windows would never be scored")
        return stride

    def tag(self, train_length: int, lengths: tuple[int, ...]) -> str:
        """Suffix of the output files: '' for plain zero-shot evaluation."""
        if self.rope_scaling == UNSCALED:
            return ""
        return f"-rope_{self.rope_scaling}_x{self.resolve_rope_factor(train_length, lengths):g}"

    def resolve_rope_factor(self, train_length: int, lengths: tuple[int, ...]) -> float:
        return self.rope_factor or max(lengths) / train_length


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise EvaluationError(f"{name}: must be an integer >= {minimum}, got {value!r}")


# ------------------------------------------------------------------------------------------------
# What a model can represent, and how it is configured at evaluation time.


def not_applicable_reason(model_cfg: ModelConfig, length: int) -> str | None:
    """Why ``length`` cannot be evaluated zero-shot, or None if it can."""
    return lm.resolve(model_cfg).encoding.unrepresentable(length)


def rescaled_model_config(model_cfg: ModelConfig, settings: EvalSettings,
                          rope_factor: float, train_length: int = 0) -> ModelConfig:
    """The run's model config with the positional encoding rescaled as ``settings`` ask
    (unchanged for ``rope_scaling="none"``); ``train_length`` is the run's ``data.seq_len``
    (YaRN's ramp is relative to it).

    Raises:
      EvaluationError: the run's encoding has no such rescaling (e.g. ntk on a learned table).
    """
    if settings.rope_scaling == EVERY_SCALING:
        raise EvaluationError("rope_scaling: all evaluates a study (--config) under every "
                              "rescaling; name one for a single run")
    try:
        return lm.rescaled(model_cfg, settings.rope_scaling, rope_factor, train_length)
    except RescalingError as e:
        raise EvaluationError(f"rope_scaling: {e}") from None


def eval_model_config(model_cfg: ModelConfig, length: int, settings: EvalSettings,
                      rope_factor: float, train_length: int = 0) -> ModelConfig:
    """The model config used for windows of ``length``: query-block attention for long windows
    (same function, memory linear in length) and the RoPE scaling, if asked."""
    model_cfg = rescaled_model_config(model_cfg, settings, rope_factor, train_length)
    if settings.attention_chunk and length > settings.attention_chunk:
        model_cfg = dataclasses.replace(model_cfg, attention_chunk=settings.attention_chunk)
    return model_cfg


# ------------------------------------------------------------------------------------------------
# Scoring.


@dataclasses.dataclass
class PlanScore:
    """Summed losses of one plan (float64 accumulators)."""

    total_nats: float
    n_scored: int
    position_nats: np.ndarray  # [L] sum of losses at each window position
    position_counts: np.ndarray  # [L] scored predictions at each window position

    @property
    def mean_loss(self) -> float:
        return self.total_nats / self.n_scored

    def position_loss(self) -> np.ndarray:
        """[L] mean loss at each position (NaN where nothing was scored)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.position_nats / self.position_counts


def loss_function(graphdef, packing=None) -> Callable:
    """Jitted ``(state, inputs [b, L], targets [b, L]) -> float32 losses [b, L]`` in nats.

    ``packing`` (the run's ``data.document_mask``, :func:`attnlab.train.step.packing_for`):
    each token attends only to its own document of the window, with positions restarting at
    each document under ``data.reset_positions``, as the run was trained; None: every token
    sees the whole window.
    """

    @jax.jit
    def losses(state, inputs, targets):
        if packing is None:
            return lm.token_losses(lm.apply(graphdef, state, inputs), targets)
        segments, positions = packing.inputs(inputs)
        model = nnx.merge(graphdef, state)
        return lm.token_losses(model(inputs, positions, segments=segments), targets)

    return losses


def score_plan(losses_fn: Callable, state, stream: np.ndarray, plan: WindowPlan, *,
               batch_tokens: int, progress: bool = False, desc: str = "") -> PlanScore:
    """Runs every window of ``plan`` through the model and sums the scored losses.

    Windows go through in batches of ``max(1, batch_tokens // L)``; the last batch is filled up
    with copies of window 0 whose losses are dropped, so each length compiles once.
    """
    length = plan.length
    batch = max(1, batch_tokens // length)
    mask = plan.score_mask()  # [n_windows, L]
    total = 0.0
    position_nats = np.zeros(length, np.float64)
    for first in tqdm(range(0, plan.n_windows, batch), desc=desc, unit="batch",
                      disable=not progress, leave=False, dynamic_ncols=True):
        rows = np.arange(first, min(first + batch, plan.n_windows))
        padded = np.concatenate([rows, np.zeros(batch - rows.size, rows.dtype)])
        inputs, targets = protocol.window_tokens(stream, plan, padded)
        token_losses = np.asarray(losses_fn(state, inputs, targets), np.float64)[: rows.size]
        scored = np.where(mask[rows], token_losses, 0.0)
        total += float(scored.sum())
        position_nats += scored.sum(axis=0)
    position_counts = mask.sum(axis=0).astype(np.int64)
    return PlanScore(total, int(mask.sum()), position_nats, position_counts)


# ------------------------------------------------------------------------------------------------
# Whole-run evaluation.


def bytes_per_token(corpus, split: str = SPLIT) -> float:
    """Average source bytes per token of ``split`` of the prepared ``corpus``, counting each
    end-of-document separator as one byte (so exactly 1.0 for the byte tokenizer)."""
    if getattr(corpus.tokenizer, "one_id_per_byte", False):  # a task's symbols have none
        return 1.0
    manifest = corpus.manifest
    try:
        n_bytes = manifest["splits"][split]["bytes"]
        documents = manifest["splits"][split].get("documents", 0)
        n_tokens = manifest["tokens"][split]
    except (KeyError, TypeError) as e:
        raise EvaluationError(f"data manifest lacks the byte or token count of {split!r}: {e}")
    separated = manifest.get("separator", {}).get("id") is not None
    separators = documents if separated else 0
    return (n_bytes + separators) / n_tokens


def evaluate_model(cfg: Config, state, stream: np.ndarray, settings: EvalSettings, *,
                   bytes_per_token: float = 1.0, progress: bool = False) -> dict:
    """Scores ``stream`` at every length and protocol of ``settings``.

    Args:
      cfg: the run's config (model shape, training length ``data.seq_len``).
      state: the model's parameters (``nnx.State``).
      stream: [n] int token ids of the evaluation split.

    Returns:
      ``{"train_length", "lengths", "stride", "n_targets", "results": [row, ...],
      "per_position": {...}, "warnings": [...]}``; see :func:`evaluate_run` for the fields.
    """
    from attnlab.train.step import packing_for  # train imports the model: not at module load

    settings.validate()
    train_length = cfg.data.seq_len
    lengths = settings.resolve_lengths(train_length)
    rope_factor = settings.resolve_rope_factor(train_length, lengths)
    rescaled = rescaled_model_config(cfg.model, settings, rope_factor,
                                     train_length)  # fails early, clearly
    stream = np.asarray(stream)
    if settings.max_tokens:
        stream = stream[: settings.max_tokens]
    requested = settings.resolve_lengths(train_length, include_train_length=False)
    if all(not_applicable_reason(cfg.model, n) for n in requested):
        raise EvaluationError(
            f"lengths: none of the requested lengths {list(requested)} can be represented: "
            f"{not_applicable_reason(cfg.model, requested[0])}")
    applicable = [n for n in lengths if not_applicable_reason(cfg.model, n) is None]
    # Every length scores the same targets. The stream is cut for all requested lengths, even
    # those that are not applicable, so that runs of every encoding score the same tokens.
    n_targets = protocol.scored_target_count(stream.shape[0], lengths)
    chosen = {name: protocol.protocol_named(name) for name in settings.protocols}
    stride = (settings.resolve_stride(lengths) if any(p.strided for p in chosen.values())
              else None)

    scorer = _Scorer(cfg, state, stream, settings, rope_factor, n_targets, stride,
                     packing_for(cfg), progress)
    rows, scores = [], {}
    for name in settings.protocols:
        for length in lengths:
            row = {"protocol": name, "stride": stride if chosen[name].strided else None,
                   "length": length, "multiplier": length / train_length}
            reason = not_applicable_reason(cfg.model, length)
            if reason is not None:
                rows.append({**row, **_empty_metrics(), "status": "not_applicable",
                             "reason": reason})
                continue
            score = scores[name, length] = scorer.run(name, length)
            rows.append({**row, **_metrics(score.mean_loss, bytes_per_token),
                         "n_scored": score.n_scored, "status": "ok", "reason": None})
        counts = {r["n_scored"] for r in rows if r["protocol"] == name and r["status"] == "ok"}
        # The comparison across lengths is only fair if every length scored the same tokens.
        if counts != {n_targets}:  # not an `assert`: it must also hold under python -O
            raise AssertionError(f"{name}: scored-token counts differ across lengths: {counts}")
    _add_ratios(rows, train_length)
    per_position = _per_position(scorer, scores, max(applicable), max(lengths))
    report = {
        "train_length": train_length, "lengths": list(lengths), "stride": stride,
        "n_tokens": int(stream.shape[0]), "n_targets": n_targets,
        "bytes_per_token": bytes_per_token,
        "rope_scaling": _rope_record(cfg.model, rescaled, settings, rope_factor),
        "document_mask": cfg.data.document_mask, "reset_positions": cfg.data.reset_positions,
        "results": rows, "per_position": per_position,
    }
    report["warnings"] = run_warnings(report)
    return report


@dataclasses.dataclass
class _Scorer:
    """Scores one (protocol, length) plan of the stream; one compiled loss per model config
    (lengths that share a config share it)."""
    cfg: Config
    state: object
    stream: np.ndarray
    settings: EvalSettings
    rope_factor: float | None
    n_targets: int
    stride: int | None
    packing: object  # data.document_mask: documents kept apart, as in training
    progress: bool
    compiled: dict = dataclasses.field(default_factory=dict)

    def losses_for(self, length: int) -> Callable:
        model_cfg = eval_model_config(self.cfg.model, length, self.settings, self.rope_factor,
                                      self.cfg.data.seq_len)
        if model_cfg not in self.compiled:
            self.compiled[model_cfg] = loss_function(
                _graphdef(dataclasses.replace(self.cfg, model=model_cfg)), self.packing)
        return self.compiled[model_cfg]

    def run(self, name: str, length: int) -> PlanScore:
        plan = protocol.make_plan(name, self.n_targets, length, self.stride)
        return score_plan(self.losses_for(length), self.state, self.stream, plan,
                          batch_tokens=self.settings.batch_tokens, progress=self.progress,
                          desc=f"{name} L={length}")


def _per_position(scorer: _Scorer, scores: dict, longest: int, longest_asked: int) -> dict:
    """Per-position loss of the longest representable length, with every window fully
    scored (reusing its nonoverlapping score when that protocol ran)."""
    whole = protocol.Nonoverlapping.name
    curve = scores.get((whole, longest)) or scorer.run(whole, longest)
    per_position = {"protocol": whole, "length": longest,
                    "n_windows": int(curve.position_counts[0]),
                    "loss": curve.position_loss().tolist()}
    if longest != longest_asked:
        per_position["note"] = (f"longest evaluated length {longest_asked} is not applicable; "
                                f"curve at {longest}")
    return per_position


def _graphdef(cfg: Config):
    from attnlab.train.state import abstract_model  # the GraphDef only: nothing is allocated

    graphdef, _ = abstract_model(cfg)
    return graphdef


def _empty_metrics() -> dict:
    # Not applicable is None (JSON null / empty CSV cell), never NaN: NaN means a bug.
    return {"loss": None, "perplexity": None, "bits_per_byte": None, "ppl_ratio": None,
            "n_scored": 0}


def _metrics(loss: float, bytes_per_token: float) -> dict:
    return {"loss": loss, "perplexity": _exp(loss),
            "bits_per_byte": loss / math.log(2) / bytes_per_token}


def _add_ratios(rows: list[dict], train_length: int) -> None:
    """r(k) = ppl(k L_train) / ppl(L_train) within each protocol (Press et al. 2022, Fig. 1)."""
    for row in rows:
        if row["status"] != "ok":
            continue
        reference = next(r for r in rows if r["protocol"] == row["protocol"]
                         and r["length"] == train_length)
        row["ppl_ratio"] = _exp(row["loss"] - reference["loss"])


def _exp(x: float) -> float:
    """exp without OverflowError (inf beyond float range; NaN stays NaN for the checks)."""
    return math.inf if x > 709.0 else math.exp(x)


def _rope_record(trained: ModelConfig, rescaled: ModelConfig, settings: EvalSettings,
                 rope_factor: float) -> dict:
    if settings.rope_scaling == UNSCALED:
        return {"method": UNSCALED}
    return {"method": settings.rope_scaling, "factor": rope_factor,
            "rope_theta": trained.rope_theta, "eval_rope_theta": rescaled.rope_theta,
            "eval_rope_scaling": rescaled.rope_scaling, "eval_rope_factor": rescaled.rope_factor,
            "eval_rope_original_len": rescaled.rope_original_len}


def run_warnings(report: dict) -> list[str]:
    """Checks on one run's numbers whose failure means a bug, not science."""
    warnings = []
    for row in report["results"]:
        if row["status"] == "ok" and not math.isfinite(row["loss"]):
            warnings.append(f"{row['protocol']} L={row['length']}: loss is {row['loss']} "
                            "(NaN/inf means a bug, e.g. an out-of-range position lookup)")
    if not all(math.isfinite(x) for x in report["per_position"]["loss"]):
        warnings.append("per-position loss has NaN/inf entries")
    return warnings


def evaluate_run(run_dir: str | Path, settings: EvalSettings = EvalSettings(), *,
                 force: bool = False, progress: bool = True) -> dict:
    """Evaluates a trained run and writes ``extrapolation[<tag>].json``, ``.csv`` (one row per
    protocol and length) and ``_positions.csv`` (the per-position curve) into ``run_dir``.

    A report made from the same checkpoint with the same settings is reused unless ``force``.

    Rows: protocol, stride, length, multiplier (length / L_train), status ('ok' or
    'not_applicable'), reason, n_scored (tokens scored: equal for every length of a protocol),
    loss (nats per token), perplexity, bits_per_byte, ppl_ratio r(k) = ppl(length) / ppl(L_train).

    Raises:
      EvaluationError: bad settings, a directory without a finished checkpoint, lengths that
        the model cannot represent at all or that the validation split is too short for.
    """
    from attnlab.data import prepare, sources
    from attnlab.train import load_config, load_params

    run_dir = Path(run_dir)
    settings.validate()
    if (run_dir / "config.json").exists() and sources.source_named(
            load_config(run_dir).data.source).is_task:
        # A task's windows are fixed-length structures, not a text to read at longer contexts.
        raise EvaluationError(f"{run_dir}: data.source={load_config(run_dir).data.source} is "
                              f"an in-context learning task, not a corpus; use attnlab icl")
    step = latest_checkpoint_step(run_dir)
    run_cfg = load_config(run_dir)
    objective = lm.resolve(run_cfg.model).objective
    if not objective.causal or objective.encoder_decoder:
        # Extrapolation scores next-token loss over growing contexts: a causal decoder's task.
        raise EvaluationError(f"{run_dir}: model.objective={objective.name} is not a causal "
                              f"decoder; attnlab extrapolate evaluates next-token prediction "
                              f"(model.objective=clm runs)")
    train_length = run_cfg.data.seq_len
    tag = settings.tag(train_length, settings.resolve_lengths(train_length))
    paths = report_paths(run_dir, tag)
    if not force and is_current(run_dir, settings, tag):
        return json.loads(paths["json"].read_text())
    # Refused before the evaluation rather than after it: a read-only run cannot take the report.
    rundir.check_can_write_file(paths["json"], "--run")

    fingerprint = checkpoint_fingerprint(run_dir, step)  # of the files about to be read
    cfg, _, state = load_params(run_dir, step)
    corpus = prepare(cfg.data)
    started = time.perf_counter()
    report = evaluate_model(cfg, state, corpus.tokens(SPLIT), settings,
                            bytes_per_token=bytes_per_token(corpus), progress=progress)
    report = {
        "format_version": FORMAT_VERSION, "attnlab_version": attnlab.__version__,
        "run_dir": str(run_dir.absolute()), "name": cfg.name, "checkpoint_step": step,
        "checkpoint_fingerprint": fingerprint,
        "pos_encoding": cfg.model.pos_encoding, "max_len": cfg.model.max_len,
        "attention_window": cfg.model.attention_window, "seed": cfg.train.seed,
        "data_seed": cfg.data.seed, "data_source": cfg.data.source,
        "tokenizer": cfg.data.tokenizer, "split": SPLIT, "settings": settings_record(settings),
        "seconds": round(time.perf_counter() - started, 3), **report,
    }
    write_report(report, paths)
    return json.loads(paths["json"].read_text())  # the same dict whether fresh or reused
