"""`attnlab env` and the environment lines every run logs first (attnlab/train/environment.py)."""

import importlib.metadata
import json

import jax
import jax.numpy as jnp
import pytest

from attnlab import cli
from attnlab.train import environment


def test_env_prints_versions_devices_peak_and_fast_paths(tmp_path, capsys):
    out = tmp_path / "env.json"
    assert cli.main(["env", f"--json={out}"]) == 0
    text = capsys.readouterr().out
    assert f"jax {importlib.metadata.version('jax')}" in text
    assert f"flax {importlib.metadata.version('flax')}" in text
    assert f"backend {jax.default_backend()}" in text
    assert "MFU peak per device: bf16" in text
    assert "cuDNN fused attention: no" in text  # no GPU here, and it says so
    found = json.loads(out.read_text())
    assert found["versions"]["orbax-checkpoint"] == importlib.metadata.version("orbax-checkpoint")
    assert len(found["devices"]) == jax.local_device_count()
    assert found["peak_flops_per_device"]["bfloat16"] > 0
    assert found["cudnn_attention"]["available"] is False
    assert isinstance(found["bf16_matmul"]["available"], bool)


@pytest.mark.parametrize("argv, named", [(["--json=/proc/env.json"], "--json"),
                                         (["--nosuch=1"], "nosuch")])
def test_env_refuses_bad_flags_in_one_line(argv, named, capsys):
    assert cli.main(["env", *argv]) == 2
    err = capsys.readouterr().err
    assert named in err and err.count("\n") == 1


# Optimised HLO as XLA prints it (operands by name, their types where they are defined), with
# the instructions that multiply matrices on a CPU (dot), in a Triton fusion and in cuBLAS.
HLO = """
%fused_dot (param_0: bf16[64,64], param_1: bf16[64,64]) -> f32[64,64] {
  %param_0 = bf16[64,64]{1,0} parameter(0)
  %param_1 = bf16[64,64]{1,0} parameter(1)
  ROOT %dot.1 = f32[64,64]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}
}
ENTRY %main (a: f32[64,64], b: bf16[64,64]) -> f32[64,64] {
  %a = f32[64,64]{1,0} parameter(0)
  %b = bf16[64,64]{1,0} parameter(1)
  %convert.2 = f32[64,64]{1,0} convert(%b)
  %dot.3 = f32[64,64]{1,0} dot(%a, %convert.2), lhs_contracting_dims={1}
  %gemm = (bf16[64,64]{1,0}, s8[4]{0}) custom-call(%b, %b), custom_call_target="__cublas$gemm"
  %other = f32[64,64]{1,0} custom-call(%a), custom_call_target="SomethingElse"
  ROOT %add = f32[64,64]{1,0} add(%dot.3, %dot.3)
}
"""


def test_matmul_dtypes_reads_each_product_by_its_operands_definitions():
    assert environment.matmul_dtypes(HLO) == [("bf16", "bf16"), ("f32", "f32"), ("bf16", "bf16")]


def test_bf16_matmul_reads_the_compiled_program():
    available, note = environment.bf16_matmul()
    a = jnp.ones((256, 256), jnp.bfloat16)
    found = environment.matmul_dtypes(jax.jit(jnp.matmul).lower(a, a).compile().as_text())
    assert found and available == all(set(f) == {"bf16"} for f in found), note


def test_a_run_logs_its_environment_first(tmp_path, capsys):
    from attnlab.train.cli import train_main

    workdir = tmp_path / "run"
    assert train_main(["--config=configs/tiny.py", f"--run={workdir}", "--noprogress",
                       "--config.train.steps=2", "--config.train.eval_every=2",
                       "--config.train.checkpoint_every=2"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("python ") and f"jax {jax.__version__}" in err[0]
    assert err[1].startswith(f"backend {jax.default_backend()}:")
    assert err[2].startswith("MFU peak: ")
    summary = json.loads((workdir / "summary.json").read_text())
    assert summary["versions"]["flax"] == importlib.metadata.version("flax")
