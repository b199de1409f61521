"""Will it fit? The memory a run or a generation needs, estimated from the config alone.

Checked before anything is allocated or compiled, so that ``--config.model.d_model=1000000``
is one line (the estimate and the machine's memory, exit 2) rather than a 16 TB allocation and a
traceback minutes later. The estimate is deliberately rough (within a small factor); a command's
``--allow-large`` flag skips the check for users who know better (e.g. with remat or swap).

Training state: float32 parameters, their gradients and Adam's two moments (16 bytes a
parameter). Activations kept for the backward pass, per micro-batch token and layer (float32;
Korthikanti et al. 2022 count ~34 values of d_model per token and layer in half precision):
about ``16 d_model + 2 d_ff`` values, plus the attention scores and probabilities
``2 heads T`` per token (``heads x chunk`` with query blocks), plus the logits and their
softmax (``3 vocab`` per token). Generation: parameters, the KV cache
``2 n_layers kv_heads head_dim (prompt + new)`` and the logits.
"""

from __future__ import annotations

import os

from attnlab.config import Config, ModelConfig
from attnlab.errors import AttnlabError
from attnlab.model import param_counts, resolve

FLOAT = 4  # bytes
TRAIN_STATE_BYTES_PER_PARAM = 4 * FLOAT  # params, grads, Adam m and v


class TooLargeError(AttnlabError):
    """The config needs more memory than the machine has (``--allow-large`` overrides)."""


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB" if n >= 1e8 else f"{n / 1e6:,.1f} MB"


def machine_memory() -> tuple[int, str]:
    """(bytes, description) of the memory the run lives in: the first accelerator's (when JAX's
    default device is a GPU/TPU that reports it), else this machine's RAM (psutil)."""
    import jax
    import psutil

    device = jax.devices()[0]
    if device.platform != "cpu":
        try:
            limit = int((device.memory_stats() or {}).get("bytes_limit", 0))
        except Exception:  # noqa: BLE001 - not every backend reports memory
            limit = 0
        if limit:
            return limit, f"the {_gb(limit)} of {device.device_kind}"
    ram = int(psutil.virtual_memory().total)
    return ram, f"this machine's {_gb(ram)} of memory"


def _attention_values_per_token(m: ModelConfig, seq_len: int) -> int:
    keys = seq_len if not m.attention_window else min(seq_len, m.attention_window)
    if m.attention_chunk and m.attention_chunk < seq_len:
        return 2 * m.n_heads * keys * m.attention_chunk // seq_len + 2 * m.n_heads
    return 2 * m.n_heads * keys


def training_bytes(cfg: Config) -> dict[str, float]:
    """``{'params', 'state', 'activations', 'total'}`` in bytes for training ``cfg``."""
    m = cfg.model
    params = float(param_counts(m)["total"])
    micro = cfg.data.batch_size // max(1, cfg.train.grad_accum)
    tokens = float(micro) * cfg.data.seq_len
    per_layer = (16 * m.d_model + 2 * resolve(m).ffn.width
                 + _attention_values_per_token(m, cfg.data.seq_len))
    activations = FLOAT * tokens * (m.n_layers * per_layer + 3 * m.vocab_size)
    state = params * TRAIN_STATE_BYTES_PER_PARAM
    return {"params": params, "state": state, "activations": activations,
            "total": state + activations}


def generation_bytes(model: ModelConfig, length: int) -> dict[str, float]:
    """``{'params', 'cache', 'total'}`` in bytes for generating up to ``length`` positions."""
    params = float(param_counts(model)["total"])
    cache = 2.0 * model.n_layers * model.kv_heads * model.head_dim * length * FLOAT
    logits_and_tokens = float(length) * 4 + model.vocab_size * FLOAT * 4
    return {"params": params, "cache": cache,
            "total": params * FLOAT + cache + logits_and_tokens}


# Depth, besides memory: each unrolled layer is its own code for XLA, and compiling grows faster
# than linearly with it (configs/tiny.py, 2 shared CPU cores: 128 layers compiled in ~40 s and
# 0.7 GB; 256 layers were still compiling after 3 min in 8.5 GB, where the memory estimate says
# 0.2 GB). A scanned stack (model.scan_layers) compiles one layer, but building the model still
# costs ~30 ms a layer in flax, three times over (shapes, state, init): minutes past ~1000.
MAX_UNROLLED_LAYERS = 128
MAX_LAYERS = 1024


def check_depth(cfg: Config, where: str = "") -> None:
    """Raises TooLargeError naming ``model.n_layers`` for a stack too deep to build and compile
    in reasonable time (see :data:`MAX_UNROLLED_LAYERS`)."""
    m = cfg.model
    if m.n_layers > MAX_LAYERS:
        raise TooLargeError(
            f"{where}config.model.n_layers={m.n_layers}: building a model this deep takes "
            f"minutes (~30 ms a layer, three times) before anything runs; at most {MAX_LAYERS}, "
            f"or pass --allow-large to try anyway")
    if m.n_layers > MAX_UNROLLED_LAYERS and not m.scan_layers:
        raise TooLargeError(
            f"{where}config.model.n_layers={m.n_layers}: unrolled, XLA compiles each layer "
            f"apart (minutes and GBs past {MAX_UNROLLED_LAYERS} layers); set "
            f"--config.model.scan_layers=True (one layer compiled, the same model), or pass "
            f"--allow-large to try anyway")


def check_training_fits(cfg: Config, *, allow_large: bool = False, where: str = "") -> None:
    """Raises TooLargeError (one line: the estimate and the machine's memory, or the depth)
    unless ``allow_large`` or ``$ATTNLAB_ALLOW_LARGE`` is set."""
    if allow_large or os.environ.get("ATTNLAB_ALLOW_LARGE"):
        return
    check_depth(cfg, where)
    need = training_bytes(cfg)
    have, described = machine_memory()
    if need["total"] > have:
        m = cfg.model
        raise TooLargeError(
            f"{where}training d_model={m.d_model} n_layers={m.n_layers} "
            f"({need['params']:.3g} parameters) needs about {_gb(need['total'])} "
            f"({_gb(need['state'])} of parameters, gradients and Adam state, "
            f"{_gb(need['activations'])} of activations at batch {cfg.data.batch_size} x "
            f"{cfg.data.seq_len}), more than {described}; pass --allow-large to try anyway")


def check_generation_fits(model: ModelConfig, length: int, *, allow_large: bool = False) -> None:
    """Like :func:`check_training_fits`, for ``attnlab generate`` up to ``length`` positions."""
    if allow_large or os.environ.get("ATTNLAB_ALLOW_LARGE"):
        return
    need = generation_bytes(model, length)
    have, described = machine_memory()
    if need["total"] > have:
        raise TooLargeError(
            f"generating {length:,} positions needs about {_gb(need['total'])} (a KV cache of "
            f"{_gb(need['cache'])}), more than {described}; lower --max-new-tokens, or pass "
            f"--allow-large to try anyway")
