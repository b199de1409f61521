"""The notebooks in notebooks/ execute, top to bottom, against real tiny sweeps.

Each test trains a tiny sweep into tmp (the same code path as a real study), points the notebook
at it through ATTNLAB_SWEEP_DIR, runs every cell with nbclient on a fresh ipykernel, and checks
that no cell failed and that the figures it promises were written. The notebooks are stored
with the outputs of such a run (tests/notebook_outputs.py: a reader of the repository sees the
figures), and checked to be their current code's.
"""

from __future__ import annotations

import pathlib

import nbformat
import pytest
from nbclient import NotebookClient

from notebook_outputs import finish, stale

from attnlab.extrapolation import EvalSettings
from attnlab.extrapolation import run_study as run_extrapolation_study
from attnlab.sweep import load_spec, run_sweep

# No signals or timings (each kernel on its own ports): the slow lane runs these two at a time,
# with the shared compilation cache.

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def execute(name: str) -> nbformat.NotebookNode:
    """Runs every cell of notebooks/<name> in a fresh kernel started in the repository root (it
    inherits this process's environment); nbclient raises CellExecutionError, with the cell and
    its traceback, if any cell fails."""
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(notebook, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    return notebook


def printed(notebook: nbformat.NotebookNode) -> str:
    """Everything the cells wrote to stdout/stderr."""
    return "".join(output.get("text", "") for cell in notebook.cells if cell.cell_type == "code"
                   for output in cell.get("outputs", []) if output.output_type == "stream")


def images(notebook: nbformat.NotebookNode) -> int:
    return sum("image/png" in output.get("data", {}) for cell in notebook.cells
               if cell.cell_type == "code" for output in cell.get("outputs", []))


def test_notebooks_are_stored_with_the_outputs_of_their_code():
    paths = sorted(NOTEBOOKS.glob("*.ipynb"))
    assert len(paths) == 4
    for path in paths:
        nbformat.validate(nbformat.read(path, as_version=4))
        assert stale(path) is None, stale(path)


@pytest.mark.slow
def test_scaling_analysis_notebook_runs_on_a_tiny_isoflop_sweep(tmp_path, monkeypatch):
    sweep_dir, figures = tmp_path / "isoflop", tmp_path / "figures"
    run_sweep(load_spec("experiments/tiny_isoflop.py"), sweep_dir, progress=False)
    monkeypatch.setenv("ATTNLAB_SWEEP_DIR", str(sweep_dir))
    monkeypatch.setenv("ATTNLAB_FIGURES_DIR", str(figures))
    monkeypatch.setenv("ATTNLAB_BOOTSTRAP", "10")
    notebook = execute("scaling_analysis.ipynb")

    out = printed(notebook)
    assert f"sweep: {sweep_dir}" in out
    always = ("kaplan_loss_vs_params", "kaplan_loss_vs_params_n", "loss_vs_compute_curves",
              "loss_vs_compute", "contours", "allocation", "chinchilla_loss_vs_params")
    for name in always:
        assert (figures / f"{name}.png").read_bytes().startswith(PNG_MAGIC), name
    # Approaches 1 and 2 need curves that cross and U-shaped IsoFLOP profiles, which a 6-run
    # sweep of seconds-long runs may not have: the notebook either draws them or says why not.
    assert (figures / "isoflop.png").exists() or "approach 2 skipped: " in out
    assert images(notebook) == len(list(figures.glob("*.png")))
    finish(notebook, "scaling_analysis.ipynb", tmp_path)


@pytest.mark.slow
def test_pe_extrapolation_notebook_runs_on_a_tiny_study(tmp_path, monkeypatch):
    study_dir, figures = tmp_path / "pe", tmp_path / "figures"
    spec = load_spec("experiments/tiny_pe.py", ["sweep.axes.model.pos_encoding=('rope', 'alibi', "
                                                "'learned')"])
    run_extrapolation_study(spec, study_dir, EvalSettings(multipliers=(1, 2, 4)), progress=False)
    monkeypatch.setenv("ATTNLAB_SWEEP_DIR", str(study_dir))
    monkeypatch.setenv("ATTNLAB_FIGURES_DIR", str(figures))
    notebook = execute("pe_extrapolation.ipynb")

    out = printed(notebook)
    assert f"sweep: {study_dir}" in out and "protocols: nonoverlapping" in out
    for name in ("ratio_nonoverlapping", "positions"):
        assert (figures / f"{name}.png").read_bytes().startswith(PNG_MAGIC), name
    assert images(notebook) == 2
    finish(notebook, "pe_extrapolation.ipynb", tmp_path)


@pytest.mark.slow
def test_icl_notebook_runs_on_a_tiny_mqar_run(tmp_path, monkeypatch):
    from attnlab.config import Config, DataConfig, ModelConfig, TrainConfig
    from attnlab.train import run

    cfg = Config(model=ModelConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, max_len=32,
                                   ffn="none", mixer="mamba", attention_every=2,
                                   pos_encoding="none", ssm_scan="sequential"),
                 data=DataConfig(source="mqar", task_vocab=32, mqar_pairs=4, seq_len=16,
                                 batch_size=4, loss_on="answers"),
                 train=TrainConfig(steps=2, warmup_steps=1, eval_every=2, eval_batches=1,
                                   log_every=1, checkpoint_every=2))
    assert run(cfg, tmp_path / "run", progress=False)["status"] == "completed"
    monkeypatch.setenv("ATTNLAB_ICL_RUN", str(tmp_path / "run"))
    notebook = execute("icl.ipynb")
    assert "pairs: accuracy" in printed(notebook)
    assert images(notebook) == 3  # the recall curve, then one row of maps per layer
    finish(notebook, "icl.ipynb", tmp_path)
