"""attnlab.cli_flags: one parser for every command; errors name the flag, --help looks alike;
one flag name means one thing in every command (attnlab.cli_vocab), and old spellings still
work with a notice."""

import dataclasses
import pathlib
import re

import pytest

from attnlab import cli, cli_vocab
from attnlab.cli_flags import Flag, HelpRequested, UsageError, parse, rename_old_flags

FLAGS = [
    Flag("law", "enum", None, "Which law.", enum_values=("kaplan", "chinchilla")),
    Flag("bootstrap", "integer", 200, "Refits."),
    Flag("plot", "string", None, "Output file.", required=True),
]


def test_a_command_without_a_config():
    values = parse(["--law", "kaplan", "--plot=a.png"], FLAGS, prog="attnlab x",
                   takes_config=False)
    assert (values["law"].value, values["bootstrap"].value, values["plot"].value) == (
        "kaplan", 200, "a.png")
    with pytest.raises(HelpRequested) as info:
        parse(["--help"], FLAGS, prog="attnlab x", takes_config=False, description="Does x.")
    assert info.value.text.startswith("Does x.\n\nusage: attnlab x [flags]\n")
    assert "--config" not in info.value.text and "--law (kaplan|chinchilla)" in info.value.text
    with pytest.raises(UsageError, match="config"):
        parse(["--config=configs/tiny.py", "--plot=a"], FLAGS, takes_config=False)


@pytest.mark.parametrize("argv, message", [
    (["--law=power", "--plot=a"], "--law=power: value should be one of <kaplan|chinchilla>"),
    (["--bootstrap=many", "--plot=a"], "--bootstrap=many"),
    (["--bootsrap=3", "--plot=a"], "Unknown command line flag 'bootsrap'"),
    (["--law=kaplan"], "--plot is required"),
    (["results.csv", "--plot=a"], "unexpected argument 'results.csv'"),
])
def test_usage_errors_name_the_flag(argv, message):
    with pytest.raises(UsageError) as info:
        parse(argv, FLAGS, prog="attnlab x", takes_config=False)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("command", ["train", "sweep", "fit", "plot", "extrapolate",
                                     "quickstart", "model-info", "generate"])
def test_every_command_has_the_same_help(command, capsys):
    assert cli.main([command, "--help"]) == 0
    text = capsys.readouterr().out
    assert f"usage: attnlab {command} " in text and "\nflags:\n" in text


@pytest.mark.parametrize("argv, flag", [
    (["fit", "--law=power"], "--law"),
    (["fit", "--law=kaplan", "--sweep"], "--sweep"),
    (["plot", "--kind=pie", "--plot=x.png"], "--kind"),
    (["plot", "--kind=isoflop"], "--plot is required"),
    (["extrapolate", "--run=x", "--protocol=skip"], "--protocol"),
    (["sweep", "--config=experiments/tiny_grid.py"], "--sweep is required"),
])
def test_every_command_reports_bad_flags_alike(argv, flag, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and flag in err and err.count("\n") == 1


# --- the vocabulary: one meaning per flag name, old spellings with a notice -------------------

EXPERIMENT = "experiments/tiny_pe.py"
FLAG_LISTS = {name: cli.command_flags(name) for name in cli.COMMANDS}
RENAMES = [(command, flag, old) for command, flags in FLAG_LISTS.items() for flag in flags
           for old in flag.old_names]
WORDS = {word.name: word for word in cli_vocab.WORDS}


def test_every_command_has_its_flags_listed():
    assert set(cli.FLAG_LISTS) == set(cli.COMMANDS)
    assert all(FLAG_LISTS[name] or name == "prepare" for name in cli.COMMANDS)


def test_a_flag_name_means_one_thing_in_every_command():
    """Same kind and same declared meaning wherever a name is used; a name several commands
    take is a vocabulary word, and a word is always declared through it."""
    uses: dict[str, dict[tuple, list[str]]] = {}
    for command, flags in FLAG_LISTS.items():
        names = [flag.name for flag in flags]
        assert len(names) == len(set(names)), command
        for flag in flags:
            key = (flag.kind, flag.meaning or flag.help)
            uses.setdefault(flag.name, {}).setdefault(key, []).append(command)
            if flag.name in WORDS:
                word = WORDS[flag.name]
                assert (flag.kind, flag.meaning) == (word.kind, word.meaning), (command, flag)
                assert flag.help.startswith(word.meaning), (command, flag.name)
            else:
                assert flag.meaning == "", (command, flag.name)
    split = {name: meanings for name, meanings in uses.items() if len(meanings) > 1}
    assert not split, split
    for name, meanings in uses.items():
        commands = next(iter(meanings.values()))
        assert len(set(commands)) == 1 or name in WORDS or _one_declaration(name, commands), name


def _one_declaration(name: str, commands: list[str]) -> bool:
    """fit and plot share one list of input flags, the laws' among them
    (attnlab.scaling.request.input_flags)."""
    from attnlab.scaling.request import input_flags

    return set(commands) == {"fit", "plot"} and name in {flag.name for flag in input_flags()}


def test_no_flag_is_a_synonym_of_a_vocabulary_word():
    synonyms = {synonym: word.name for word in cli_vocab.WORDS for synonym in word.synonyms}
    for command, flags in FLAG_LISTS.items():
        for flag in flags:
            assert flag.name not in synonyms, (command, flag.name, synonyms.get(flag.name))
    meanings = [word.meaning for word in cli_vocab.WORDS]
    assert len(meanings) == len(set(meanings))


def test_every_old_name_maps_to_exactly_one_new_name():
    for command, flags in FLAG_LISTS.items():
        current = {flag.name for flag in flags}
        targets: dict[str, set[str]] = {}
        for flag in flags:
            for old in flag.old_names:
                targets.setdefault(old.name, set()).add(flag.name)
                assert flag.name in WORDS, (command, flag.name)  # renamed into the vocabulary
                # a current name is an old one only where its value tells the two apart
                assert old.name not in current or old.when is not None, (command, old.name)
                word = WORDS[flag.name]
                assert old.name in word.synonyms or old.name in WORDS, (command, old.name)
        assert all(len(new) == 1 for new in targets.values()), (command, targets)


@pytest.mark.parametrize("spaced", [False, True], ids=["equals", "spaced"])
@pytest.mark.parametrize("command, flag, old", RENAMES,
                         ids=[f"{c}--{o.name}" for c, _, o in RENAMES])
def test_an_old_spelling_parses_to_the_same_value_with_one_notice(command, flag, old, spaced,
                                                                  capsys):
    flags = [dataclasses.replace(f, required=False) for f in FLAG_LISTS[command]]
    value = {"integer": "7", "config": EXPERIMENT}.get(flag.kind, "some/dir")
    if old.when is not None:
        value = EXPERIMENT
    assert old.when is None or old.when(value)
    given = [f"--{old.name}", value] if spaced else [f"--{old.name}={value}"]
    then = parse(given, flags, takes_config=False)  # unless the list declares --config
    notes = capsys.readouterr().err.splitlines()
    now = parse([f"--{flag.name}={value}"], flags, takes_config=False)
    assert capsys.readouterr().err == ""
    assert _value(then, flag.name) == _value(now, flag.name) is not None
    assert len(notes) == 1, notes
    assert notes[0].startswith(f"note: --{old.name}") and f" is now --{flag.name}" in notes[0]


def _value(values, name):
    value = values[name].value
    return value.to_dict() if hasattr(value, "to_dict") else value


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_help_shows_only_the_new_names(command, capsys):
    assert cli.main([command, "--help"]) == 0
    text = capsys.readouterr().out
    for flag in FLAG_LISTS[command]:
        assert f"--{flag.name}" in text
        for old in flag.old_names:
            if old.when is None:
                assert not re.search(rf"--{re.escape(old.name)}(?![\w-])", text), old.name


def test_the_dispatcher_says_each_notice_once_and_checks_the_new_flag(tmp_path, capsys):
    """The dispatcher renames before it checks output paths (the command's parse then finds
    nothing old): one notice per old spelling, the error names the new flag."""
    assert cli.main(["plot", "--results", str(tmp_path / "r.csv"), "--kind=isoflop",
                     f"--out={tmp_path / 'x.txt'}", "--seed=3", "--seed=4"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines[:3] == ["note: --results is now --sweep; the old name will be removed",
                         "note: --out is now --plot; the old name will be removed",
                         "note: --seed is now --bootstrap-seed; the old name will be removed"]
    assert len(lines) == 4 and lines[3].startswith(f"error: --plot={tmp_path / 'x.txt'}: ")
    assert cli.main(["train", f"--workdir={tmp_path / 'run'}"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["note: --workdir is now --run; the old name will be removed",
                     f"error: --config is required: --run={tmp_path / 'run'} holds no "
                     "config.json to resume from"]


@pytest.mark.parametrize("argv, error", [
    ([f"--sweep={EXPERIMENT}"], "--sweep is required with --config"),
    ([f"--sweep={EXPERIMENT}:gpu", "--run=r"], "give exactly one of --run"),
    (["--sweep", EXPERIMENT, "--workdir=DIR", "--lengths=a"], "--lengths"),
])
def test_extrapolate_tells_the_old_sweep_from_the_new_by_its_value(argv, error, capsys):
    assert cli.main(["extrapolate", *argv]) == 2
    lines = capsys.readouterr().err.splitlines()
    notes = [line for line in lines if line.startswith("note: ")]
    assert notes[0].startswith(f"note: --sweep={EXPERIMENT}") and "is now --config=" in notes[0]
    assert "an experiment file" in notes[0]
    assert len(notes) == 1 + any(a.startswith("--workdir") for a in argv)
    assert lines[-1].startswith("error: ") and error in lines[-1] and len(lines) == len(notes) + 1


def test_old_spellings_of_a_bool_spaced_values_and_what_follows_a_double_dash():
    flags = [Flag("fast", "bool", False, "x", old_names=("quick",)),
             Flag("sweep", "string", None, "y", old_names=("workdir",))]
    argv, notes = rename_old_flags(["--noquick", "--workdir", "d", "--quick", "--",
                                    "--workdir"], flags)
    assert argv == ["--nofast", "--sweep", "d", "--fast", "--", "--workdir"]
    assert notes == ["note: --quick is now --fast; the old name will be removed",
                     "note: --workdir is now --sweep; the old name will be removed"]
    assert rename_old_flags(["--noworkdir", "--quickly", "-workdir=d"], flags) == (
        ["--noworkdir", "--quickly", "-sweep=d"],
        ["note: --workdir is now --sweep; the old name will be removed"])


# A command as the docs spell it: `attnlab CMD` and its arguments, up to the end of the line
# (continuations joined), a closing backtick, a pipe, a semicolon or a parenthesis.
DOCUMENTED_COMMAND = re.compile(r"(?:^|[\s`(])attnlab ([a-z-]+)((?: +[^\s`|;)]+)*)")


def _documented_commands():
    """(file:line, command, flag name) for every --flag of every `attnlab CMD` in the docs,
    the README, the experiments and the benchmark scripts."""
    root = pathlib.Path(__file__).resolve().parents[1]
    files = [root / "README.md", *sorted((root / "docs").rglob("*.md")),
             *sorted((root / "experiments").glob("*.py")),
             *sorted((root / "benchmarks").glob("*.sh"))]
    for path in files:
        text = path.read_text().replace("\\\n", " ")
        for match in DOCUMENTED_COMMAND.finditer(text):
            if match.group(1) not in FLAG_LISTS:
                continue
            where = f"{path.relative_to(root)}:{text[:match.start()].count(chr(10)) + 1}"
            for word in match.group(2).split():
                if word.startswith("--") and not word.startswith("--config."):
                    yield where, match.group(1), word[2:].split("=")[0]


def test_every_documented_command_names_its_commands_flags():
    """A renamed or removed flag leaves no documented command behind: each --flag the docs give
    a command is one of its flags by its current name (old spellings parse with a notice, so
    the docs must not teach them)."""
    uses = list(_documented_commands())
    assert len(uses) > 1000  # the scan reads the docs' commands (a broken pattern finds none)
    common = {"help", "helpfull", "overwrite"}  # the dispatcher's own
    valid = {command: common | {flag.name for flag in flags}
             | {"no" + flag.name for flag in flags if flag.kind == "bool"}
             for command, flags in FLAG_LISTS.items()}
    wrong = [f"{where}: attnlab {command} --{name}" for where, command, name in uses
             if name not in valid[command]]
    assert not wrong, wrong
