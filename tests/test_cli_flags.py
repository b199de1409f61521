"""attnlab.cli_flags: one parser for every command; errors name the flag, --help looks alike."""

import pytest

from attnlab import cli
from attnlab.cli_flags import Flag, HelpRequested, UsageError, parse

FLAGS = [
    Flag("law", "enum", None, "Which law.", enum_values=("kaplan", "chinchilla")),
    Flag("bootstrap", "integer", 200, "Refits."),
    Flag("out", "string", None, "Output file.", required=True),
]


def test_a_command_without_a_config():
    values = parse(["--law", "kaplan", "--out=a.png"], FLAGS, prog="attnlab x",
                   takes_config=False)
    assert (values["law"].value, values["bootstrap"].value, values["out"].value) == (
        "kaplan", 200, "a.png")
    with pytest.raises(HelpRequested) as info:
        parse(["--help"], FLAGS, prog="attnlab x", takes_config=False, description="Does x.")
    assert info.value.text.startswith("Does x.\n\nusage: attnlab x [flags]\n")
    assert "--config" not in info.value.text and "--law (kaplan|chinchilla)" in info.value.text
    with pytest.raises(UsageError, match="config"):
        parse(["--config=configs/tiny.py", "--out=a"], FLAGS, takes_config=False)


@pytest.mark.parametrize("argv, message", [
    (["--law=power", "--out=a"], "--law=power: value should be one of <kaplan|chinchilla>"),
    (["--bootstrap=many", "--out=a"], "--bootstrap=many"),
    (["--bootsrap=3", "--out=a"], "Unknown command line flag 'bootsrap'"),
    (["--law=kaplan"], "--out is required"),
    (["results.csv", "--out=a"], "unexpected argument 'results.csv'"),
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
    (["fit", "--law=kaplan", "--results"], "--results"),
    (["plot", "--kind=pie", "--out=x.png"], "--kind"),
    (["plot", "--kind=isoflop"], "--out is required"),
    (["extrapolate", "--run=x", "--protocol=skip"], "--protocol"),
    (["sweep", "--config=experiments/tiny_grid.py"], "--workdir"),
])
def test_every_command_reports_bad_flags_alike(argv, flag, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and flag in err and err.count("\n") == 1
