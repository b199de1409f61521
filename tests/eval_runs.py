"""Tiny pystdlib runs for the eval tests, and a float64 reference of a continuation's
log-likelihood from the model's full forward pass."""

from pathlib import Path

import jax
import numpy as np
import scipy.special

import configs.tiny
from attnlab.config import from_config_dict
from attnlab.model import apply

_forward = jax.jit(apply, static_argnums=0)  # the model's full forward pass, unpadded


def tiny_config(cache_dir, *, steps: int = 8, seed: int = 0, batch_size: int = 8,
                learning_rate: float = 3e-3, **model):
    """configs/tiny.py on a 200 kB slice, trained ``steps`` steps and checkpointed at the end;
    ``model``: model fields to change."""
    config = configs.tiny.get_config()
    config.data.cache_dir = str(cache_dir)
    config.data.max_bytes = 200_000
    config.data.batch_size = batch_size
    config.train.update(steps=steps, seed=seed, learning_rate=learning_rate,
                        warmup_steps=min(20, steps), eval_every=steps, checkpoint_every=steps,
                        log_every=steps, eval_batches=1)
    config.model.update(model)
    return from_config_dict(config)


def train(directory: Path, cache_dir, **kwargs) -> Path:
    from attnlab.train import run

    assert run(tiny_config(cache_dir, **kwargs), directory, progress=False)["status"] == \
        "completed"
    return directory


def reference_loglikelihood(graphdef, params, seq_len: int, context: str, continuation: str
                            ) -> float:
    """log p(continuation | separator + context) in float64: the byte row cut to its last
    ``seq_len + 1`` tokens, one unpadded forward pass, numpy's log-softmax in float64."""
    row = np.frombuffer(b"\0" + (context + continuation).encode(), np.uint8).astype(np.int32)
    row = row[-(seq_len + 1):]
    logits = np.asarray(_forward(graphdef, params, row[None, :-1]), np.float64)[0]
    logp = scipy.special.log_softmax(logits, axis=-1)[np.arange(len(row) - 1), row[1:]]
    return float(logp[-len(continuation.encode()):].sum())
