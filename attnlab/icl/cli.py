"""``attnlab icl`` (a run on its in-context-learning task, beside the task's optimum) and
``attnlab attention`` (every layer's token-mixing map on one example, and its heads' scores)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from attnlab import cli_vocab as vocab
from attnlab import outputs
from attnlab.cli_flags import Flag, parse, refuse_given
from attnlab.errors import AttnlabError

ICL_FLAGS = [
    vocab.RUN.flag("Its latest checkpoint is used.", default=""),
    vocab.SWEEP.flag("Of task runs: every finished run is evaluated; writes icl_table.csv, "
                     "icl.json and icl_accuracy.png there.", default=""),
    vocab.STEP.flag(),
    vocab.JSON.flag("The results (default RUN/icl.json).", default=""),
    vocab.PLOT.flag("The results drawn (default RUN/icl.png).", default=""),
    Flag("batches", "integer", 8, "Validation batches of data.batch_size windows to evaluate."),
    Flag("pairs", "string", "", "mqar: numbers of pairs to evaluate, e.g. 1,2,4,8 (default "
         "powers of two up to the trained number)."),
]

ATTENTION_FLAGS = [
    vocab.RUN.flag("Its latest checkpoint is used.", required=True),
    vocab.STEP.flag(),
    Flag("text", "string", "", "Text to look at (runs trained on text)."),
    Flag("task-example", "bool", False, "Look at one validation window of the run's task."),
    Flag("example", "integer", 0, "Which validation window (--task-example)."),
    vocab.PLOT.flag("The grid of maps, layers x heads (default RUN/attention.png).", default="",
                    old_names=("out",)),
    vocab.JSON.flag("The head scores (default RUN/attention.json).", default=""),
]


def _refuse_config(argv: list[str], command: str) -> None:
    if any(a.startswith("--config") for a in argv):
        raise AttnlabError(f"{command} uses the run's own config (its config.json): --config "
                           "and --config.* overrides would not be applied, so they are refused")


def _output(values, flag: str, run: str, default: str) -> Path:
    path = Path(values[flag].value or Path(run) / default)
    if path.is_dir():
        raise AttnlabError(f"--{flag}={path} is a directory; give a file name")
    if not path.parent.is_dir():
        raise AttnlabError(f"--{flag}={path}: the directory {path.parent} does not exist")
    return path


def icl_main(argv: list[str]) -> int:
    """``attnlab icl --run=DIR [--json=FILE] [--plot=FILE] [--pairs=1,2,4]``."""
    _refuse_config(argv, "icl")
    values = parse(argv, ICL_FLAGS, prog="attnlab icl", takes_config=False)
    if bool(values.run) == bool(values.sweep):
        raise AttnlabError("give exactly one of --run=DIR and --sweep=DIR")
    if values.batches < 1:
        raise AttnlabError(f"--batches must be >= 1, got {values.batches}")
    if values.sweep:
        refuse_given(values, ("step", "pairs"), "applies to --run; --sweep evaluates every "
                     "run at its last checkpoint on its own task")
        return _sweep_main(values)
    run = values.run
    try:
        pairs = tuple(int(p) for p in values.pairs.split(",") if p.strip())
    except ValueError:
        raise AttnlabError(f"--pairs={values.pairs}: give integers separated by commas") from None
    json_path = _output(values, "json", run, "icl.json")
    plot_path = _output(values, "plot", run, "icl.png")
    from attnlab.train.load import load_config

    cfg = load_config(run)
    from attnlab.data import icl as icl_data
    from attnlab.data import sources
    from attnlab.icl.evaluate import evaluate_run

    task = sources.task_of(cfg.data)
    if task is None:
        raise AttnlabError(f"--run={run} trained on data.source={cfg.data.source}, not an "
                           f"in-context learning task ({', '.join(sources.task_sources())})")
    if pairs and not isinstance(task, icl_data.MQARTask):
        raise AttnlabError(f"--pairs applies to mqar runs; --run={run} trained on "
                           f"{cfg.data.source}")
    for n in pairs:
        try:
            dataclasses.replace(task, pairs=n).validate()
        except AttnlabError as e:
            raise AttnlabError(f"--pairs={values.pairs}: {n} pairs: {e}") from None
    from attnlab.train.load import load_params

    cfg, graphdef, params = load_params(run, values.step)
    extra = {"pairs": pairs} if pairs else {}
    result = evaluate_run(cfg, graphdef, params, batch_size=cfg.data.batch_size,
                          n_batches=values.batches, **extra)
    result["run"], result["config"] = str(run), cfg.to_dict()
    outputs.write_json(json_path, result)
    from attnlab.icl.evaluate import report_of
    from attnlab.icl.plots import plot_result

    plot_result(result, report_of(result), plot_path)
    _print_result(result)
    print(f"results: {json_path}\nplot: {plot_path}")
    return 0


def _print_result(result: dict) -> None:
    from attnlab.icl.evaluate import report_of

    print("\n".join(report_of(result).lines(result)), flush=True)


def attention_main(argv: list[str]) -> int:
    """``attnlab attention --run=DIR (--task-example | --text=TEXT) [--plot=PNG] [--json=FILE]``."""
    _refuse_config(argv, "attention")
    values = parse(argv, ATTENTION_FLAGS, prog="attnlab attention", takes_config=False)
    run, text, example = values.run, values.text, values["task-example"].value
    if bool(text) == bool(example):
        raise AttnlabError("give exactly one of --text=TEXT and --task-example")
    if values.example < 0:
        raise AttnlabError(f"--example must be >= 0, got {values.example}")
    if text and values["example"].present:  # else it would be ignored
        raise AttnlabError("--example picks a validation window of --task-example, not --text")
    out_path = _output(values, "plot", run, "attention.png")
    json_path = _output(values, "json", run, "attention.json")
    from attnlab.data import icl as icl_data
    from attnlab.data import sources
    from attnlab.model import inspect, resolve
    from attnlab.train.load import load_config

    cfg = load_config(run)
    arch = resolve(cfg.model)
    task = sources.task_of(cfg.data)
    _refuse_for_run(arch, cfg, task, run, text=text)
    tokens, labels = _prompt(cfg, task, text, values.example)
    # Checkpoints, the step and matplotlib only once the run and prompt are known to be usable.
    from attnlab.icl.plots import plot_maps
    from attnlab.train.load import load_params
    from attnlab.train.step import packing_for

    cfg, graphdef, params = load_params(run, values.step)
    packing = packing_for(cfg)  # data.document_mask: documents apart, as the run trained
    segments, positions = (None, None) if packing is None else packing.inputs(tokens)
    maps = inspect.attention_maps(graphdef, params, tokens, segments=segments,
                                  positions=positions)
    kinds = arch.stack.layers
    # The scores read a map as where a head attends: Mamba's signed channel maps are drawn only.
    attending = [m if kind.mixer.map_is_distribution else None for m, kind in zip(maps, kinds)]
    result = {"run": str(run), "tokens": tokens[0].tolist(),
              "mixers": [kind.mixer.name for kind in kinds],
              "previous_token": [None if m is None else inspect.previous_token_scores(m).tolist()
                                 for m in attending]}
    if isinstance(task, icl_data.InductionTask):
        result.update(inspect.head_scores(attending, task.prefixes(tokens)))
    outputs.write_json(json_path, result)
    plot_maps([inspect.drawable(m[0]) for m in maps], labels, out_path,
              titles=[(k.mixer.name, "head") if k.mixer.map_is_distribution
                      else (f"{k.mixer.name} |alpha|", "channels") for k in kinds])
    print(f"maps: {out_path}\nscores: {json_path}")
    return 0


def _refuse_for_run(arch, cfg, task, run: str, *, text: str) -> None:
    """A prompt the run cannot read: text for a vector or token task, a task example for a
    text run, and an encoder-decoder (two stacks' maps)."""
    if arch.objective.reads_vectors and text:
        raise AttnlabError(f"--text: --run={run} reads prompts of vectors (data.source="
                           f"{cfg.data.source}), not text; use --task-example")
    if arch.decoder is not None:
        raise AttnlabError(f"model.objective={cfg.model.objective}: attnlab attention draws a "
                           "single stack's maps, not the encoder-decoder's")
    if not text and task is None:
        raise AttnlabError(f"--task-example: --run={run} trained on data.source="
                           f"{cfg.data.source}, not a task; use --text")
    if text and task is not None:
        raise AttnlabError(f"--text: --run={run} trained on the token task {cfg.data.source}, "
                           "which has no text; use --task-example")


def _prompt(cfg, task, text: str, example: int):
    """(tokens [1, T] (or vectors [1, T, d]), a label per position): the task's validation
    prompt ``example``, or the text."""
    import numpy as np

    from attnlab.data import icl as icl_data
    from attnlab.data import icl_regression, prepare

    if isinstance(task, icl_regression.RegressionTask):
        return _regression_example(task, example)
    if task is not None:
        windows = icl_data.TaskCorpus(task).validation_set(task.seq_len, example + 1, 1)
        tokens = windows[0, example : example + 1, :-1]
        return tokens, [str(t) for t in tokens[0]]
    tokenizer = prepare(cfg.data).tokenizer
    tokens = np.asarray(tokenizer.encode(text), np.int32)[None]
    if tokens.shape[1] > cfg.data.seq_len:
        raise AttnlabError(f"--text is {tokens.shape[1]} tokens, longer than the run's "
                           f"training context data.seq_len={cfg.data.seq_len}")
    return tokens, [tokenizer.decode(np.asarray([t])).decode("utf-8", "replace")
                    for t in tokens[0]]


def _regression_example(task, example: int):
    """Prompt ``example`` of the regression task's validation set, float32 ``[1, 2k, d]`` (the
    loss weights dropped), labelled ``x1 y1 x2 y2 ...``."""
    from attnlab.data import icl_regression

    corpus = icl_regression.RegressionCorpus(task)
    windows = corpus.validation_set(2 * task.examples, example + 1, 1)
    prompt = windows[0, example : example + 1, :, :-1]
    labels = [f"{'xy'[i % 2]}{i // 2 + 1}" for i in range(prompt.shape[1])]
    return prompt, labels


def _sweep_main(values) -> int:
    """Every finished run of a sweep on its task: one row per run (its variant, width, mixer
    and headline number), the table, the JSON of all results and the plot."""
    import pandas as pd

    from attnlab.icl.evaluate import evaluate_run, report_of
    from attnlab.icl.plots import plot_sweep
    from attnlab.train.load import load_params

    sweep = Path(values.sweep)
    runs = sorted(p.parent for p in sweep.glob("runs/*/run.json"))
    if not runs:
        raise AttnlabError(f"--sweep={sweep}: no runs/*/run.json: not a sweep directory")
    rows, results = [], {}
    for run in runs:
        axes = json.loads((run / "run.json").read_text()).get("axes", {})
        summary = run / "summary.json"
        if not summary.exists() or json.loads(summary.read_text()).get("status") != "completed":
            continue
        cfg, graphdef, params = load_params(run)
        result = evaluate_run(cfg, graphdef, params, batch_size=cfg.data.batch_size,
                              n_batches=values.batches)
        variant = next((str(v) for k, v in axes.items() if "." not in k), cfg.model.mixer)
        report = report_of(result)
        headline = report.headline
        rows.append({"run_id": run.name, "variant": variant, "mixer": cfg.model.mixer,
                     "d_model": cfg.model.d_model, "n_layers": cfg.model.n_layers,
                     "task": result["task"], headline: result[headline],
                     "stderr": result[report.headline_stderr]})
        results[run.name] = result
        print(f"{run.name}: {variant} d_model={cfg.model.d_model} {headline} "
              f"{result[headline]:.4f}", flush=True)
    if not rows:
        raise AttnlabError(f"--sweep={sweep}: no finished run yet")
    table = pd.DataFrame(rows).sort_values(["variant", "d_model"])
    table.to_csv(sweep / "icl_table.csv", index=False)
    outputs.write_json(sweep / "icl.json", results)
    if table["task"].nunique() > 1:
        raise AttnlabError(f"--sweep={sweep}: its runs train on different tasks "
                           f"({', '.join(sorted(table['task'].unique()))}); one table holds one")
    plot_sweep(table, sweep / "icl_accuracy.png", report.headline, report.headline_label)
    print(table.to_string(index=False))
    print(f"table: {sweep / 'icl_table.csv'}\nplot: {sweep / 'icl_accuracy.png'}")
    return 0
