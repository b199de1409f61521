"""The words of the ``attnlab`` command line: what a flag is (:class:`Flag`), and every flag that
several commands take, declared once here with its meaning (a :class:`Word`).

    --config  an experiment or config file     --run   a run directory (read or written)
    --sweep   a sweep directory                --plot  a figure file to write
    --json    a JSON report file to write      --bootstrap-seed  the bootstrap's seed

A command takes a word as ``RUN.flag("Its latest checkpoint is used.", required=True)``: the
meaning opens the help and the note adds what is particular to the command. Former spellings are
declared on the command's flag (``old_names``) and rewritten by :func:`attnlab.cli_flags.parse`
with a one-line notice, so each command says which of its own flags they were.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable


@dataclasses.dataclass(frozen=True)
class OldName:
    """A former spelling of a flag. ``when`` (given the value) tells the old meaning apart where
    the spelling names a current flag too; ``why`` is added to the notice."""

    name: str
    when: Callable[[str], bool] | None = None
    why: str = ""


@dataclasses.dataclass
class Flag:
    """A plain flag: DEFINE_<kind>(name, default, help); kind "config" is the config file flag
    (``--config=FILE`` and its ``--config.a.b=v`` overrides)."""

    name: str
    kind: str  # "string" | "integer" | "float" | "bool" | "enum" | "config"
    default: Any
    help: str
    enum_values: tuple[str, ...] = ()
    required: bool = False
    meaning: str = ""  # its Word's meaning; "" for a flag of one command
    old_names: tuple[OldName, ...] = ()

    def __post_init__(self):
        self.old_names = tuple(old if isinstance(old, OldName) else OldName(old)
                               for old in self.old_names)


@dataclasses.dataclass(frozen=True)
class Word:
    """A flag name with one meaning in every command that takes it. ``synonyms``: names no flag
    may take instead (they would mean this word)."""

    name: str
    kind: str
    meaning: str
    enum_values: tuple[str, ...] = ()
    synonyms: tuple[str, ...] = ()

    def flag(self, note: str = "", *, default: Any = None, required: bool = False,
             old_names: tuple = (), enum_values: tuple[str, ...] = ()) -> Flag:
        """``enum_values``: the choices, where a registry the vocabulary cannot import names
        them."""
        return Flag(self.name, self.kind, default, f"{self.meaning} {note}".strip(),
                    enum_values or self.enum_values, required, self.meaning, tuple(old_names))


def is_experiment_file(value: str) -> bool:
    """``experiments/x.py`` or ``experiments/x.py:gpu``, an existing file."""
    path = value if os.path.exists(value) else value.rpartition(":")[0] or value
    return path.endswith(".py") and os.path.isfile(path)


CONFIG = Word("config", "config", "An experiment or config file defining get_config() "
              "(FILE.py, or FILE.py:SCALE to pass a scale such as gpu).",
              synonyms=("experiment", "config-file", "spec"))
RUN = Word("run", "string", "A run directory.", synonyms=("workdir", "run-dir", "rundir", "dir"))
SWEEP = Word("sweep", "string", "A sweep directory.",
             synonyms=("workdir", "results", "sweep-dir", "study"))
PLOT = Word("plot", "string", "A figure file to write.",
            synonyms=("out", "output", "figure", "png", "plot-positions"))
JSON = Word("json", "string", "A JSON report file to write.", synonyms=("json-out", "report"))
BOOTSTRAP_SEED = Word("bootstrap-seed", "integer", "Seed of the bootstrap's resampling.")
SEED = Word("seed", "integer", "Seed of the sampling of new tokens.")
STEP = Word("step", "integer", "Checkpoint step (default: the latest).")
BOOTSTRAP = Word("bootstrap", "integer", "Bootstrap refits (0: none).")
CI_LEVEL = Word("ci-level", "float", "Coverage of the intervals.")
BY = Word("by", "string", "A results column whose values group the runs.")
BEST_OVER = Word("best-over", "string", "A results column (e.g. train.learning_rate) whose best "
                 "value each point takes: the runs at the value with the lowest mean loss over "
                 "seeds; a value with an unfinished run is never picked. Several columns, outer "
                 "first (e.g. params,train.learning_rate), are picked together.")
PAIR = Word("pair", "string", "Runs sharing this column's value (e.g. train.seed: the same "
            "initialisation and data order) are resampled together.")
HOLDOUT = Word("holdout", "string", "Runs to leave out of the fit: largest-budget, "
               "budget:C[,C...], or flops>X / params>X / tokens>X (>= too); attnlab fit also "
               "takes leave-future-out (each budget predicted from those below it), and "
               "run:NAME[,NAME...] for the laws of whole curves (multipower, annealing).")
ALLOW_LARGE = Word("allow-large", "bool", "Go on even if the estimated memory exceeds the "
                   "machine's.")
ALLOW_NONEMPTY = Word("allow-nonempty", "bool", "Write into an existing directory that holds "
                      "files other than attnlab's.")
PROGRESS = Word("progress", "bool", "Show progress.")
PARALLEL = Word("parallel", "integer", "Runs at a time with the local launcher, each pinned to "
                "cpu_count/parallel cores.")
LAUNCHER = Word("launcher", "enum", "Where runs execute: local worker processes or Ray.")

WORDS = (CONFIG, RUN, SWEEP, PLOT, JSON, BOOTSTRAP_SEED, SEED, STEP, BOOTSTRAP, CI_LEVEL, BY,
         BEST_OVER, PAIR, HOLDOUT, ALLOW_LARGE, ALLOW_NONEMPTY, PROGRESS, PARALLEL, LAUNCHER)
