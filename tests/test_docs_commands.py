"""The commands the README and the guides print still parse, and the README's and the tutorial's
run as printed (at a tiny scale where the printed one takes minutes or more).

Every ``attnlab CMD ...`` in README.md, docs/*.md and notebooks/README.md is parsed by the
command's own flag declarations (absl, the config file and its ``--config.x`` overrides), as
the command would parse it: a renamed flag, a removed enum value, a moved config field or a
config file that no longer exists fails here. A config file named as a placeholder
(``configs/x.py``, ``experiments/<name>.py``) is left out of that check, by the names in
PLACEHOLDERS.
"""

from __future__ import annotations

import os
import pathlib
import re
import shlex
import subprocess
import sys

import pytest

from attnlab import cli, cli_flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "notebooks" / "README.md",
         *sorted((ROOT / "docs").glob("*.md"))]
# A template, not a command: the reader fills in what these stand for.
TEMPLATE = re.compile(r"\.\.\.|\$|<[A-Za-z]|\[--")
# Names the guides use for "your file here".
PLACEHOLDERS = re.compile(r"(^|/)(x|y|my[\w-]*|FILE|NAME|SPEC)\.py")
FENCE = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`((?:\.venv/bin/)?attnlab [a-z-]+ [^`]*=[^`]*)`")


def _commands(text: str) -> list[tuple[str, list[str]]]:
    """The commands of one printed line (several where ``;`` or ``&&`` join them)."""
    return [c for part in re.split(r" ; | && ", text) if (c := _command(part))]


def _command(text: str) -> tuple[str, list[str]] | None:
    """(command, argv) of one printed command, or None for a template or prose."""
    text = re.sub(r"^(\$ |\.venv/bin/)", "", text.strip())
    if not text.startswith("attnlab ") or TEMPLATE.search(text):
        return None
    try:
        words = shlex.split(text, comments=True)
    except ValueError:
        return None
    if len(words) < 2 or words[1] not in cli.COMMANDS:
        return None
    return words[1], words[2:]


def documented_commands(pages=PAGES) -> list[tuple[str, str, list[str]]]:
    """(page:line, command, argv) of every `attnlab CMD ...` the pages print: each line of a
    code block that starts with it, and each inline code span holding one with a flag."""
    found = []
    for page in pages:
        text = page.read_text()
        spans = [pair for m in FENCE.finditer(text) for pair in _lines(m.group(1), m.start(1))]
        prose = FENCE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)  # same offsets
        spans += [(m.start(1), m.group(1)) for m in INLINE.finditer(prose)]
        for start, line in spans:
            where = f"{page.relative_to(ROOT)}:{text[:start].count(chr(10)) + 1}"
            found += [(where, *command) for command in _commands(line)]
    return found


def _lines(block: str, offset: int):
    """(offset, line) of a code block's lines, continuations (a trailing backslash) joined."""
    pairs, pending, start = [], "", offset
    for raw in block.splitlines(keepends=True):
        if not pending:
            start = offset
        offset += len(raw)
        line = raw.rstrip("\n")
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        pairs.append((start, pending + line))
        pending = ""
    return pairs


def parse_as_the_command_would(name: str, argv: list[str]) -> None:
    """Raises UsageError (or the config file's error) where ``attnlab NAME argv`` would not
    parse. A placeholder config file is dropped first, with its overrides."""
    flags = cli.command_flags(name)
    argv = [a for a in cli_flags.canonical_argv(argv) if a not in ("--overwrite", "--help")]
    argv, _ = cli_flags.rename_old_flags(argv, flags)
    config = next((a.partition("=")[2] for a in argv if a.startswith("--config=")), None)
    if config is not None and PLACEHOLDERS.search(config):
        argv = [a for a in argv if not a.startswith("--config")]
    config_flag = [f for f in flags if f.kind == "config"]
    required = bool(config_flag and config_flag[0].required)
    if name == "quickstart" and config is None:
        argv = ["--config=experiments/quickstart.py", *argv]  # its default_argv
    if required and not any(a.startswith("--config=") for a in argv):
        return  # only a placeholder config: nothing left to check but the flag names
    cli_flags.parse(argv, flags, prog=f"attnlab {name}", takes_config=bool(config_flag),
                    config_required=required)


def test_every_documented_command_parses(capsys):
    commands = documented_commands()
    assert len(commands) > 200  # the scan reads the docs (a broken pattern would find none)
    broken = []
    for where, name, argv in commands:
        try:
            parse_as_the_command_would(name, argv)
        except Exception as e:  # noqa: BLE001 - any failure to parse is the finding
            broken.append(f"{where}: attnlab {name} {shlex.join(argv)}: {e}")
    capsys.readouterr()  # the config files' own prints
    assert not broken, "\n".join(broken)


# The README's and the tutorial's commands, run as a new user runs them from the repository root.
# A command that takes minutes or hours as printed runs with the override beside it (more
# arguments, which the command's parser takes last): the same command at a tiny scale.
TINY = {
    "quickstart": ["--config=experiments/tiny_isoflop.py", "--config.sweep.budgets=(1e9,2e9,4e9)",
                   "--bootstrap=20"],
    "train": ["--config.train.steps=4", "--config.train.warmup_steps=1",
              "--config.train.eval_every=4", "--config.train.checkpoint_every=4"],
    "extrapolate": ["--max-tokens=2048"],
    # the fits' intervals at 20 refits, not 200-1000: the command, not the interval, is checked
    "fit": ["--bootstrap=20"],
    "plot": ["--bootstrap=20"],
}
# Ones that cannot run here, and why.
NOT_HERE = {
    "--config=experiments/architectures.py": "two hours of training (the tutorial says so)",
    "experiments/quickstart.py:gpu": "a GPU study",
    "ATTNLAB_SWEEP_DIR": "jupyter lab, an interactive program",
    "--launcher=ray": "a Ray cluster",
}


def tutorial_commands() -> list[tuple[str, str, list[str]]]:
    return documented_commands([ROOT / "README.md", ROOT / "docs" / "tutorial.md"])


@pytest.mark.slow
def test_the_readme_and_tutorial_commands_run(tmp_path):
    """In a scratch copy of what they read (configs/, experiments/, docs/results/), in order, so
    that a command reading an earlier one's output (the quickstart's directory) finds it."""
    for folder in ("configs", "experiments", "docs"):
        os.symlink(ROOT / folder, tmp_path / folder)
    (tmp_path / "attnlab").mkdir()  # the tutorial's corpus: a copy of some source files
    for path in sorted((ROOT / "attnlab").glob("*.py"))[:8]:
        (tmp_path / "attnlab" / path.name).write_text(path.read_text())
    subprocess.run(["bash", "-c", "mkdir -p my_texts && cp attnlab/*.py my_texts/"],
                   cwd=tmp_path, check=True)
    ran, skipped, seen = 0, [], set()
    for where, name, argv in tutorial_commands():
        text = shlex.join([name, *argv])
        reason = next((why for key, why in NOT_HERE.items() if key in text), None)
        if text in seen:  # the README's and the tutorial's first steps are the same commands
            reason = "run above, as printed"
        if reason:
            skipped.append(f"{where}: {reason}")
            continue
        seen.add(text)
        full = [sys.executable, "-m", "attnlab.cli", name, *argv, *TINY.get(name, [])]
        if name == "generate":
            full += ["--max-new-tokens=8"]
        done = subprocess.run(full, cwd=tmp_path, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{where}: attnlab {text}\n{done.stderr[-3000:]}"
        ran += 1
    assert ran >= 12, (ran, skipped)
