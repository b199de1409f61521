"""Every check a run makes before it writes or compiles anything, cheapest first: the mesh and
batch, the corpus (prepared or read from its cache) against the model and the token budget, the
programs' shapes, and the newest intact checkpoint against those shapes."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import jax
import numpy as np

from attnlab import rundir
from attnlab.config import Config
from attnlab.data import Corpus, prepare
from attnlab.data.sources import separator_id, window_layout
from attnlab.errors import ConfigError
from attnlab.model import resolve
from attnlab.results import corpus_digest
from attnlab.train.branch import branch_start
from attnlab.train.checkpoint import (Checkpoints, CheckpointError, DamagedCheckpointError,
                                     check_compatible, move_aside)
from attnlab.train.programs import ProgramCache, Programs
from attnlab.train.scoring import TaskEvaluation
from attnlab.train.sharding import check_batch_divides
from attnlab.train.state import TrainState


@dataclasses.dataclass
class Preflight:
    """What the checks found; nothing has been written yet."""

    corpus: Corpus
    budget_warnings: list[str]
    programs: Programs
    latest: int | None  # newest intact checkpoint step; None for a fresh run
    meta: dict  # its record ({} for a fresh run)
    state: TrainState | None = None  # restored from it (already verified readable)
    notes: list[str] = dataclasses.field(default_factory=list)  # e.g. damaged steps moved aside
    branched: bool = False  # ``latest`` is the trunk's checkpoint a cooldown branch starts from
    val_windows: np.ndarray | None = None  # :func:`validation_windows`, drawn by the check
    tasks: TaskEvaluation | None = None  # train.eval_tasks, their rows made by the check

    @property
    def mesh(self) -> jax.sharding.Mesh:
        return self.programs.mesh


def check_corpus(cfg: Config, corpus) -> tuple[list[str], np.ndarray]:
    """Checks the model and the token budget of ``cfg`` against its prepared ``corpus``.

    Returns the budget warnings (data repeated past one epoch) and the validation windows
    (:func:`validation_windows`); raises ConfigError / CorpusTooSmallError naming the field (a
    vocabulary larger than the model's, windows longer than the training split, a validation
    split smaller than train.eval_batches batches).
    """
    if corpus.vocab_size > cfg.model.vocab_size:
        raise ConfigError("model.vocab_size", f"{cfg.model.vocab_size} is smaller than the "
                          f"tokenizer's vocabulary ({corpus.vocab_size})")
    if resolve(cfg.model).objective.uses_mask and corpus.vocab_size >= cfg.model.vocab_size:
        raise ConfigError("model.vocab_size", f"model.objective={cfg.model.objective} needs a "
                          f"[MASK] id after the tokenizer's {corpus.vocab_size} ids: set "
                          f"model.vocab_size >= {corpus.vocab_size + 1}")
    if cfg.data.document_mask and corpus.tokenizer.eos_id != separator_id(cfg.data):
        raise ConfigError("data.document_mask", f"the corpus at {corpus.directory} ends its "
                          f"documents with id {corpus.tokenizer.eos_id}, not the expected "
                          f"{separator_id(cfg.data)}; rebuild it")
    # Drawn now: a split too small for it is refused before anything trains.
    windows = validation_windows(cfg, corpus)
    tokens = cfg.total_steps * cfg.data.batch_size * cfg.data.seq_len
    with warnings.catch_warnings():  # the caller reports them (metrics writer, sweep notes)
        warnings.simplefilter("ignore")
        return corpus.budget_warnings(tokens, cfg.data.seq_len), windows


def validation_windows(cfg: Config, corpus) -> np.ndarray:
    """``[eval_batches * grad_accum, micro_batch, *row]``: the windows that train.eval_batches
    full batches hold, in micro-batches (evaluated with training's memory), so the set does
    not depend on grad_accum. Tokens, or a regression task's prompts."""
    accum = cfg.train.grad_accum
    _, dtype = window_layout(cfg.data)
    return np.asarray(corpus.validation_set(cfg.data.seq_len, cfg.data.batch_size // accum,
                                            cfg.train.eval_batches * accum), dtype)


def preflight(cfg: Config, workdir: Path, cache: ProgramCache) -> Preflight:
    """Every check that can fail on bad input, cheapest first; raises AttnlabError."""
    mesh = cache.lone_mesh(cfg)
    check_batch_divides(cfg, mesh.size, jax.process_count())
    corpus = prepare(cfg.data)
    return resume_point(cfg, workdir, corpus, check_corpus(cfg, corpus), cache.get(cfg, mesh))


def resume_point(cfg: Config, workdir: Path, corpus: Corpus,
                 checked: tuple[list[str], np.ndarray], programs: Programs) -> Preflight:
    """The preflight's last check: the newest intact checkpoint in ``workdir``, read with
    ``programs``' shapes (an ensemble's members share one set); a cooldown branch without one
    of its own starts from its trunk's (:func:`attnlab.train.branch.branch_start`).
    ``checked``: :func:`check_corpus`'s answer. The ``train.eval_tasks`` are read and put in
    the corpus's tokens first, before a damaged checkpoint is moved aside."""
    budget_warnings, val_windows = checked
    tasks = TaskEvaluation(cfg, corpus.tokenizer) if cfg.train.eval_tasks else None
    directory = workdir / rundir.CHECKPOINT_DIR
    latest, meta, state, notes = None, {}, None, []
    if directory.exists():
        check_same_corpus(cfg, workdir, corpus)
        latest, meta, state, notes = newest_intact_checkpoint(cfg, directory, programs)
    if latest is None and cfg.train.branch_from:  # a cooldown branch starts from its trunk
        latest, meta, state = branch_start(cfg, workdir, programs)
        return Preflight(corpus, budget_warnings, programs, latest, meta, state, notes,
                         branched=True, val_windows=val_windows, tasks=tasks)
    return Preflight(corpus, budget_warnings, programs, latest, meta, state, notes,
                     val_windows=val_windows, tasks=tasks)


def check_same_corpus(cfg: Config, workdir: Path, corpus: Corpus) -> None:
    """A run resumes on the bytes it started on: ConfigError when the prepared corpus's sha256
    differs from the one its summary records (its shards or tokenizer changed since: the rest
    of the run would read another corpus, and its record describe only that one)."""
    summary = rundir.read_json_or_none(workdir / rundir.SUMMARY_FILE) or {}
    started, now = corpus_digest(summary.get("dataset")), corpus_digest(corpus.manifest)
    if started and now and started != now:
        field = "data.path" if cfg.data.path else "data.source"
        raise ConfigError(field, f"the corpus differs from the one this run started on "
                                 f"(sha256 {started[:12]}, now {now[:12]}): its files or "
                                 f"tokenizer changed; restore them to resume {workdir}, or "
                                 f"train a new --run")


def newest_intact_checkpoint(cfg: Config, directory: Path, programs: Programs
                             ) -> tuple[int | None, dict, TrainState | None, list[str]]:
    """The newest checkpoint that reads back whole: ``(step, meta, state, notes)``.

    A step whose files are truncated or corrupted (a disk filled up, a copy cut short) is moved
    aside to ``checkpoints/corrupt-<step>`` (kept for inspection, never deleted) and the next
    older one is tried; each move is one line in ``notes``. With none intact the run starts
    from step 0. A checkpoint that reads fine but belongs to another model is an error
    (CheckpointError), not damage.
    """
    notes: list[str] = []
    while True:
        with Checkpoints(directory, keep=cfg.train.keep_checkpoints, read_only=True) as ckpts:
            steps = sorted(ckpts.all_steps(), reverse=True)
            if not steps:
                return None, {}, None, notes
            step = steps[0]
            try:
                meta = ckpts.read_meta(step)
                check_compatible(meta, cfg.model, programs.param_shapes,
                                 f"checkpoint {directory / str(step)}")
                if step > cfg.total_steps:
                    raise CheckpointError(f"the latest checkpoint (step {step}) is past this "
                                          f"run's {cfg.total_steps} steps")
                state = ckpts.restore(step, programs.abstract_state, programs.shardings)
                return step, meta, state, notes
            except DamagedCheckpointError as e:
                damaged = e
        moved = move_aside(directory, step)
        notes.append(f"checkpoint step {step} is damaged ({damaged}); moved it to {moved} and "
                     + (f"resuming from step {steps[1]}" if steps[1:] else "starting from step 0"))
