"""Where metrics go: ``metrics.jsonl``, TensorBoard event files, and the terminal.

On a terminal the progress is a tqdm bar (steps, ETA, tokens/s, loss); when stdout/stderr is not
a TTY (a log file, a sweep worker) it is one plain line per log step instead.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Iterator, TextIO

import numpy as np

from tqdm.auto import tqdm


def _format_duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    return f"{hours}h{rest // 60:02d}m" if hours else f"{rest // 60}m{rest % 60:02d}s"


def scalar_metrics(values: dict[str, Any]) -> dict[str, float]:
    """Named scalars of a step's extra metrics (an MoE's ``moe_*``): a scalar as it is, a
    per-layer vector ``[layers]`` as ``name/l<i>``, a per-layer, per-expert array ``[layers, E]``
    as ``name/l<i>/e<j>`` (each a TensorBoard curve)."""
    out = {}
    for key, value in values.items():
        array = np.asarray(value, np.float64)
        for index in np.ndindex(array.shape):
            suffix = "".join(f"/{axis}{i}" for axis, i in zip("le", index))
            out[key + suffix] = float(array[index])
    return out


class MetricsWriter:
    """Appends records to ``metrics.jsonl``, mirrors scalars to TensorBoard, shows progress.

    Args:
      workdir: the run directory.
      total_steps, start_step: for the progress bar and ETA.
      progress: show a bar (TTY) or plain lines (not a TTY); False shows nothing.
      write_files: False on every process but the first of a multi-process run.
      stream: where the bar / lines go (stderr by default, like tqdm).
    """

    def __init__(self, workdir: Path, *, total_steps: int, start_step: int, progress: bool = True,
                 write_files: bool = True, stream: TextIO | None = None):
        self.workdir = Path(workdir)
        self.total_steps = total_steps
        self.write_files = write_files
        self.stream = stream or sys.stderr
        self.progress = progress and write_files
        self.use_bar = self.progress and self.stream.isatty()
        self._jsonl = None
        self._tb = None
        if write_files:
            self._jsonl = open(self.workdir / "metrics.jsonl", "a", buffering=1)
            from tensorboardX import SummaryWriter

            # purge_step: a resumed run hides events that its killed predecessor logged after
            # the checkpoint it resumes from.
            self._tb = SummaryWriter(str(self.workdir / "tensorboard"), purge_step=start_step + 1)
        self._bar = None
        self._postfix: dict[str, str] = {}  # latest loss, val_loss, tok/s shown beside the bar
        if self.use_bar:
            self._bar = tqdm(total=total_steps, initial=start_step, unit="step",
                             dynamic_ncols=True, file=self.stream)

    def step(self, step: int) -> None:
        """Advances the bar to ``step`` (every step; cheap)."""
        if self._bar is not None:
            self._bar.update(step - self._bar.n)

    def log(self, record: dict[str, Any]) -> None:
        """Writes one record (must hold ``step``); scalars also go to TensorBoard."""
        if not self.write_files:
            return
        try:
            self._jsonl.write(json.dumps(record, allow_nan=True) + "\n")
        except OSError as e:  # a full disk: say which file (a write to an open file names none)
            raise OSError(e.errno, e.strerror, str(self.workdir / "metrics.jsonl")) from None
        for key, value in record.items():
            if (key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
                    and math.isfinite(value)):
                group = "val" if key.startswith(("val", "eval/")) else "train"
                self._tb.add_scalar(f"{group}/{key}", value, record["step"])
        self._tb.flush()
        if not self.progress:
            return
        if self._bar is not None:
            if "loss" in record:
                self._postfix["loss"] = f"{record['loss']:.4f}"
            if "val_loss" in record:
                self._postfix["val_loss"] = f"{record['val_loss']:.4f}"
            if "tokens_per_s" in record:
                self._postfix["tok/s"] = f"{record['tokens_per_s']:,.0f}"
            self._bar.set_postfix(self._postfix, refresh=True)
            return
        self.stream.write(self._line(record) + "\n")
        self.stream.flush()

    def _line(self, record: dict[str, Any]) -> str:
        step = record["step"]
        parts = [f"step {step}/{self.total_steps}"]
        if "val_loss" in record:
            parts.append(f"val_loss {record['val_loss']:.4f}")
        if "loss" in record:
            parts.append(f"loss {record['loss']:.4f}")
        if "lr" in record:
            parts.append(f"lr {record['lr']:.2e}")
        if "grad_norm" in record:
            parts.append(f"grad_norm {record['grad_norm']:.3f}")
        if "tokens_per_s" in record:
            parts.append(f"{record['tokens_per_s']:,.0f} tok/s")
        if "mfu" in record:
            parts.append(f"MFU {100 * record['mfu']:.1f}%")
        if record.get("tokens_per_s") and record.get("tokens") and step:
            seconds_per_step = record["tokens"] / step / record["tokens_per_s"]
            parts.append(f"ETA {_format_duration(seconds_per_step * (self.total_steps - step))}")
        return " | ".join(parts)

    def message(self, text: str) -> None:
        """A line for the user that does not break the bar."""
        if not self.progress:
            return
        if self._bar is not None:
            self._bar.write(text, file=self.stream)
        else:
            self.stream.write(text + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        if self._tb is not None:
            self._tb.close()
        if self._jsonl is not None:
            self._jsonl.close()


class Throughput:
    """Training tokens per second, leaving out what is not a training step: compilation (the
    first step of a process), evaluation and checkpointing (run them inside :meth:`paused`,
    which adds up their seconds in ``paused_seconds``).

    Totals carry over restarts (``tokens``, ``seconds``, ``paused_seconds`` from the checkpoint
    record).
    """

    def __init__(self, tokens_per_step: int, tokens: int = 0, seconds: float = 0.0,
                 paused_seconds: dict[str, float] | None = None):
        self.tokens_per_step = tokens_per_step
        self.tokens, self.seconds = tokens, seconds
        self.paused_seconds: dict[str, float] = dict(paused_seconds or {})  # by what ran
        self._since: float | None = None  # end of the last step counted (None: not started)
        self._steps = 0  # steps finished since then
        self._window_tokens, self._window_seconds = 0, 0.0

    def step_done(self) -> None:
        """Call after each step has finished on the device."""
        if self._since is None:  # the first step: its time held the compilation, not counted
            self._since = time.perf_counter()
        else:
            self._steps += 1

    def _fold(self) -> None:
        if self._since is None or not self._steps:
            return
        now = time.perf_counter()
        tokens, seconds = self._steps * self.tokens_per_step, now - self._since
        self.tokens += tokens
        self.seconds += seconds
        self._window_tokens += tokens
        self._window_seconds += seconds
        self._since, self._steps = now, 0

    @contextlib.contextmanager
    def paused(self, what: str) -> Iterator[None]:
        """Counts the steps so far, leaves out the time spent inside the block (adding it to
        ``paused_seconds[what]``), and counts the steps after it again from its end (the
        block's device work has finished: evaluation reads its results back, a checkpoint save
        copies the state off the device before returning; the save's background writes slow
        the next steps, which are counted)."""
        self._fold()
        running = self._since is not None  # else the next step is still the compiling one
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            self.paused_seconds[what] = self.paused_seconds.get(what, 0.0) + end - start
            if running:
                self._since = end

    def rate(self) -> float | None:
        """Tokens/s since the previous call (None if no step was timed)."""
        self._fold()
        tokens, seconds = self._window_tokens, self._window_seconds
        self._window_tokens, self._window_seconds = 0, 0.0
        return tokens / seconds if tokens and seconds > 0 else None

    def mean_rate(self) -> float | None:
        """Tokens/s over every timed step of the run so far."""
        return self.tokens / self.seconds if self.tokens and self.seconds > 0 else None
