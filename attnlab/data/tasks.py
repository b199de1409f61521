"""Multiple-choice tasks: a context, its choices and the index of the gold one.

A task file is JSON lines, one example a line: ``{"context": str, "choices": [str, ...],
"answer": int}``. Two tasks are generated from the interpreter's standard library (the files
of pystdlib's test split, so a run trained on pystdlib has not read them), deterministically
for a seed and a Python version, with no download. Distractors are drawn as the gold choices
are (by occurrence), so a model that ignores the context is at chance:

* ``stdlib_line_end``: which of four line ends completes a line cut in the middle;
* ``stdlib_next_line``: which of four lines is the real next line after a file's text;
* ``stdlib_call_name``: which of four called names completes the text before a call's ``(``.

Adding a task is one subclass of :class:`Task` and one line in :data:`TASKS`.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np

from attnlab.data import files as files_lib
from attnlab.errors import AttnlabError

CHOICES = 4  # of the generated tasks
CONTEXT_BYTES = 400  # text before a generated example's gold choice (the scorer keeps its end)


class TaskError(AttnlabError):
    """A task that cannot be read: names the file and line, or the task."""


@dataclasses.dataclass(frozen=True)
class Example:
    context: str
    choices: tuple[str, ...]
    answer: int
    where: str = ""  # "FILE:LINE" of a file's example, for error messages

    def to_json(self) -> dict:
        return {"context": self.context, "choices": list(self.choices), "answer": self.answer}


def parse_example(line: str, where: str) -> Example:
    """One JSON line as an :class:`Example`; raises TaskError naming ``where`` (FILE:LINE)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise TaskError(f"{where}: not a JSON object ({e.msg})") from None
    if not isinstance(record, dict):
        raise TaskError(f"{where}: not a JSON object")
    for key in ("context", "choices", "answer"):
        if key not in record:
            raise TaskError(f"{where}: no {key!r} (each line holds context, choices, answer)")
    context, choices, answer = record["context"], record["choices"], record["answer"]
    if not isinstance(context, str):
        raise TaskError(f"{where}: 'context' must be a string")
    if (not isinstance(choices, list) or len(choices) < 2
            or not all(isinstance(c, str) and c for c in choices)):
        raise TaskError(f"{where}: 'choices' must be a list of two or more non-empty strings")
    if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer < len(choices):
        raise TaskError(f"{where}: 'answer' must be an index into the {len(choices)} choices, "
                        f"got {answer!r}")
    return Example(context, tuple(choices), answer, where)


def read_examples(path: str | Path) -> list[Example]:
    """The examples of a JSON-lines file (blank lines skipped)."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise TaskError(f"{path}: cannot read the task file ({e})") from None
    examples = [parse_example(line, f"{path}:{i}") for i, line in enumerate(lines, 1)
                if line.strip()]
    if not examples:
        raise TaskError(f"{path}: holds no example (one JSON object a line)")
    return examples


def write_examples(examples: list[Example], path: str | Path) -> None:
    """``examples`` as a JSON-lines task file."""
    Path(path).write_text("".join(json.dumps(e.to_json()) + "\n" for e in examples),
                          encoding="utf-8")


class Task:
    """A named list of examples."""

    name = ""
    title = ""

    def examples(self) -> list[Example]:
        raise NotImplementedError


class FileTask(Task):
    """The examples of a JSON-lines file; named after the file."""

    title = "a JSON-lines task file"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.name = self.path.stem

    def examples(self):
        return read_examples(self.path)


class StdlibTask(Task):
    """A task generated from the standard library's test-split files: ``size`` examples drawn
    with ``seed``, each with ``CHOICES`` choices of at most ``max_choice_bytes`` ASCII bytes."""

    def __init__(self, size: int = 200, seed: int = 0, max_choice_bytes: int = 24):
        self.size, self.seed, self.max_choice_bytes = size, seed, max_choice_bytes

    def candidates(self, text: str) -> list[tuple[int, str]]:
        """``(offset, gold)`` of the file ``text``: a gold choice begins at ``offset``."""
        raise NotImplementedError

    def examples(self):
        rng = np.random.default_rng(self.seed)
        found = [(text, offset, gold) for text in _test_split_texts()
                 for offset, gold in self.candidates(text)
                 if 2 <= len(gold) <= self.max_choice_bytes and gold.isascii()]
        # Distractors drawn as the gold ones are (by occurrence, not from the distinct
        # strings): a model that ignores the context cannot tell them apart.
        pool = [gold for _, _, gold in found]
        if len(found) < self.size or len(set(pool)) < CHOICES:
            raise TaskError(f"{self.name}: the standard library's test split holds "
                            f"{len(found)} candidates, fewer than the {self.size} asked")
        out = []
        for i in rng.choice(len(found), self.size, replace=False):
            text, offset, gold = found[i]
            out.append(_example(text[max(0, offset - CONTEXT_BYTES):offset], gold, pool, rng))
        return out


def _example(context: str, gold: str, pool: list[str], rng: np.random.Generator) -> Example:
    """``gold`` among ``CHOICES - 1`` other strings drawn from ``pool``, at a random place."""
    others = []
    while len(others) < CHOICES - 1:
        other = pool[rng.integers(len(pool))]
        if other != gold and other not in others:
            others.append(other)
    answer = int(rng.integers(CHOICES))
    return Example(context, tuple(others[:answer] + [gold] + others[answer:]), answer)


class StdlibNextLine(StdlibTask):
    """The real next line (its indentation included, no newline) against lines from anywhere
    in the split."""

    name = "stdlib_next_line"
    title = "the next line of a standard-library file, among four"

    def candidates(self, text):
        out, offset = [], 0
        for line in text.splitlines(keepends=True):
            if offset >= 80 and line.strip():  # some text before it to read
                out.append((offset, line.rstrip()))
            offset += len(line)
        return out


# a name followed by "(", not an attribute's, a definition's or a class's
class StdlibLineEnd(StdlibTask):
    """A line cut in the middle of its text: the rest of it against the rests of other lines
    (the easiest: the bytes just before the cut constrain the first ones after it)."""

    name = "stdlib_line_end"
    title = "the rest of a standard-library line cut in the middle, among four"

    def candidates(self, text):
        out, offset = [], 0
        for line in text.splitlines(keepends=True):
            body = line.rstrip()
            cut = (len(body) + len(body) - len(body.lstrip())) // 2  # halfway into the text
            if offset >= 80 and len(body.strip()) >= 8:
                out.append((offset + cut, body[cut:]))
            offset += len(line)
        return out


_CALL = re.compile(r"(?<![\w.])(?<!def )(?<!class )([A-Za-z_]\w{2,})\(")


class StdlibCallName(StdlibTask):
    """The name called at a ``name(`` (not an attribute's) against names called elsewhere."""

    name = "stdlib_call_name"
    title = "the name a standard-library call calls, among four"

    def candidates(self, text):
        return [(m.start(1), m.group(1) + "(") for m in _CALL.finditer(text) if m.start() >= 80]


def _test_split_texts() -> list[str]:
    """The ASCII-decodable text of every test-split standard-library file, by path."""
    _, files = files_lib.stdlib_files()
    texts = []
    for f in files:
        if files_lib.split_of(f.relpath) == "test":
            data = Path(f.path).read_bytes()
            if data.isascii() and b"\0" not in data:
                texts.append(data.decode("ascii"))
    return texts


TASKS: dict[str, type[StdlibTask]] = {t.name: t for t in (StdlibLineEnd, StdlibNextLine,
                                                            StdlibCallName)}


def task_of(spec: str, *, size: int = 200, seed: int = 0) -> Task:
    """A registered task's name, or a JSON-lines file; raises TaskError for neither."""
    if spec in TASKS:
        return TASKS[spec](size=size, seed=seed)
    if Path(spec).is_file():
        return FileTask(spec)
    raise TaskError(f"task {spec!r} is neither a task ({', '.join(TASKS)}) nor an "
                    f"existing JSON-lines file")


def tasks_of(specs: list[str], *, size: int = 200, seed: int = 0) -> list[Task]:
    """The tasks ``specs`` name (registered names or files), each named once."""
    tasks = [task_of(spec, size=size, seed=seed) for spec in specs]
    names = [t.name for t in tasks]
    for name in names:
        if names.count(name) > 1:
            raise TaskError(f"two tasks are named {name!r}: rename a file")
    return tasks
