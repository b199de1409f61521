"""attnlab's training step against two peers written here from the equations, timed interleaved
in one process: a naive-JAX step (jax.numpy + optax, no Flax) and a PyTorch eager GPT.

    .venv-bench/bin/python benchmarks/peer_pytorch.py [--rounds 5] [--steps 5]
        [--shapes 128,2,32,128 256,4,16,256 384,6,8,256] [--variants default,bias] [--no-torch]

The model, for all three (GPT-2 / nanoGPT shape; Radford et al. 2019, Vaswani et al. 2017):

    x = E[tokens] + P[positions]                                   (learned positions)
    per layer (pre-LN):  x = x + W_o MHA(LN(x));  x = x + W_2 gelu_tanh(W_1 LN(x))
    MHA: softmax(q k^T / sqrt(64) + causal mask) v per head (head_dim 64); d_ff = 4 d
    logits = LN(x) E^T (tied head); mean next-token cross-entropy
    AdamW (lr 1e-3, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices) after global-norm
    clipping to 1.0; float32; byte vocabulary (256).

The peers have linear biases (as GPT-2 and nanoGPT); attnlab runs as configured (``--variants``:
``default`` = attnlab's bias-free model, ``bias`` = ``model.linear_bias=True``, the same model
as the peers; ``autodiff_norm`` / ``bias_autodiff_norm``: the same with the norms left to
autodiff, attnlab's first norms). Timing: for each shape, ``--rounds`` rounds; in each round every contestant runs
one block of ``--steps`` steps (after warm-up), in a fixed order, so that load changes hit all
of them alike; medians over rounds of tokens/s, and ratios of the medians. ``os.getloadavg()``
is printed per round: numbers taken at a load above the core count mislead (PyTorch's
threads suffer more from oversubscription than XLA's).

PyTorch: ``torch.set_num_threads(os.cpu_count())`` (all cores, as XLA:CPU uses), eager mode,
``F.scaled_dot_product_attention(is_causal=True)``. Without torch installed the PyTorch column is
skipped with a note (install it with ``pip install -e '.[bench]'`` into a separate venv).

The fp32 matmul peak is the best of several probes (jnp.matmul at 1024^3 and 2048^3, repeated):
a single probe on a shared machine reads anywhere from a fraction to the whole of the peak.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/train_step.py

from attnlab.model import init_model  # noqa: E402
from attnlab.model import layers as model_layers  # noqa: E402
from attnlab.train.loop import training_flops_per_token  # noqa: E402
from attnlab.train.mfu import measure_matmul_peak  # noqa: E402
from attnlab.train.optimizer import make_optimizer  # noqa: E402
from attnlab.train.state import init_train_state  # noqa: E402
from attnlab.train.step import make_train_step  # noqa: E402
from train_step import config  # noqa: E402

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the bench extra is optional
    torch = None

SHAPES = ((128, 2, 32, 128), (256, 4, 16, 256), (384, 6, 8, 256))
VOCAB, HEAD_DIM = 256, 64
LR, BETAS, EPS, WD, CLIP = 1e-3, (0.9, 0.95), 1e-8, 0.1, 1.0


def tokens_for(batch: int, seq: int) -> np.ndarray:
    """Synthetic int32 windows ``[batch, seq + 1]``: the step's speed does not depend on them."""
    return np.random.default_rng(0).integers(0, VOCAB, (batch, seq + 1), dtype=np.int32)


# --------------------------------------------------------------------------------------------
# attnlab: the real train step (benchmarks/train_step.py's model)
# --------------------------------------------------------------------------------------------


def attnlab_config(d, layers, batch, seq, variant: str = "default"):
    """benchmarks/train_step.py's model; ``variant`` containing ``bias``: model.linear_bias;
    ``rmsnorm``: RMSNorm."""
    cfg = config(d, layers, batch, seq, dtype="float32", attention_impl="einsum")
    model = cfg.model
    if "bias" in variant:
        model = dataclasses.replace(model, linear_bias=True)
    if "rmsnorm" in variant:
        model = dataclasses.replace(model, norm="rmsnorm")
    return dataclasses.replace(cfg, model=model)


def _autodiff_standardize(x, eps):
    """The textbook LayerNorm formula attnlab used before its custom VJP, left to autodiff."""
    mean = x.mean(axis=-1, keepdims=True)
    var = jnp.square(x - mean).mean(axis=-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps)


def _autodiff_rms(x, eps):
    return x * jax.lax.rsqrt(jnp.square(x).mean(axis=-1, keepdims=True) + eps)


@contextlib.contextmanager
def autodiff_norms(enabled: bool):
    """While tracing: attnlab's norms differentiated by autodiff (attnlab's first norms),
    not by their custom VJPs (``attnlab.model.layers.standardize`` / ``rms_normalize``)."""
    saved = model_layers.standardize, model_layers.rms_normalize
    if enabled:
        model_layers.standardize, model_layers.rms_normalize = _autodiff_standardize, _autodiff_rms
    try:
        yield
    finally:
        model_layers.standardize, model_layers.rms_normalize = saved


def attnlab_step(d, layers, batch, seq, variant: str = "default"):
    """The compiled attnlab train step (state donated), its initial state, batch and config.
    ``variant`` containing ``autodiff_norm``: compiled with :func:`autodiff_norms`."""
    cfg = attnlab_config(d, layers, batch, seq, variant)
    tx, schedule = make_optimizer(cfg.train, cfg.total_steps, cfg.model.d_model)
    graphdef, _ = init_model(cfg.model, 0)
    state = jax.jit(lambda: init_train_state(cfg, tx))()
    batch_array = jax.device_put(tokens_for(batch, seq)[None])
    step = jax.jit(make_train_step(cfg, graphdef, tx, schedule), donate_argnums=0)
    with autodiff_norms("autodiff_norm" in variant):
        compiled = step.lower(state, batch_array).compile()
    return compiled, state, batch_array, cfg


def attnlab_runner(d, layers, batch, seq, variant: str = "default"):
    """``run(n)``: ``n`` attnlab train steps (jitted, state donated), blocking at the end."""
    step, state, batch_array, cfg = attnlab_step(d, layers, batch, seq, variant)
    holder = {"state": state}

    def run(n):
        metrics = None
        for _ in range(n):
            holder["state"], metrics = step(holder["state"], batch_array)
        jax.block_until_ready(metrics)

    return run, cfg


# --------------------------------------------------------------------------------------------
# naive JAX: pure functions of a dict of arrays, optax, nothing clever
# --------------------------------------------------------------------------------------------


def naive_init(key, d, layers, seq):
    """GPT-2 init: N(0, 0.02), residual projections 0.02 / sqrt(2 layers), zero biases."""
    keys = iter(jax.random.split(key, 2 + 4 * layers))
    normal = lambda shape, std=0.02: std * jax.random.normal(next(keys), shape)  # noqa: E731
    resid = 0.02 / math.sqrt(2 * layers)
    params = {"wte": normal((VOCAB, d)), "wpe": normal((seq, d)),
              "ln_f": (jnp.ones(d), jnp.zeros(d)), "blocks": []}
    for _ in range(layers):
        params["blocks"].append({
            "ln1": (jnp.ones(d), jnp.zeros(d)), "ln2": (jnp.ones(d), jnp.zeros(d)),
            "w_qkv": normal((d, 3 * d)), "b_qkv": jnp.zeros(3 * d),
            "w_o": normal((d, d), resid), "b_o": jnp.zeros(d),
            "w_1": normal((d, 4 * d)), "b_1": jnp.zeros(4 * d),
            "w_2": normal((4 * d, d), resid), "b_2": jnp.zeros(d),
        })
    return params


def naive_layer_norm(x, scale_bias, eps=1e-5):
    """Ba et al. 2016: ``(x - mean) / sqrt(var + eps) * g + b`` over the last axis."""
    g, b = scale_bias
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * g + b


def naive_loss(params, tokens):
    """Mean next-token cross-entropy of ``tokens [batch, seq + 1]``."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    batch, seq = inputs.shape
    d = params["wte"].shape[1]
    heads = d // HEAD_DIM
    x = params["wte"][inputs] + params["wpe"][:seq]
    mask = jnp.tril(jnp.ones((seq, seq), bool))
    for p in params["blocks"]:
        h = naive_layer_norm(x, p["ln1"])
        q, k, v = jnp.split(h @ p["w_qkv"] + p["b_qkv"], 3, axis=-1)
        q, k, v = (t.reshape(batch, seq, heads, HEAD_DIM) for t in (q, k, v))
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(HEAD_DIM)  # Vaswani eq. 1
        probs = jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), axis=-1)
        attn = jnp.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch, seq, d)
        x = x + attn @ p["w_o"] + p["b_o"]
        h = naive_layer_norm(x, p["ln2"])
        x = x + jax.nn.gelu(h @ p["w_1"] + p["b_1"], approximate=True) @ p["w_2"] + p["b_2"]
    logits = naive_layer_norm(x, params["ln_f"]) @ params["wte"].T
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


def naive_step(d, layers, seq):
    """The naive-JAX training step (not jitted) and its initial ``(params, opt_state)``."""
    params = naive_init(jax.random.key(0), d, layers, seq)
    decay = jax.tree.map(lambda a: a.ndim >= 2, params)  # matrices only, as nanoGPT
    tx = optax.chain(optax.clip_by_global_norm(CLIP),
                     optax.adamw(LR, b1=BETAS[0], b2=BETAS[1], eps=EPS, weight_decay=WD,
                                 mask=decay))

    def step(params, opt_state, tokens):
        loss, grads = jax.value_and_grad(naive_loss)(params, tokens)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return step, (params, tx.init(params))


def naive_runner(d, layers, batch, seq):
    step, state = naive_step(d, layers, seq)
    step = jax.jit(step, donate_argnums=(0, 1))
    holder = {"state": state}
    tokens = jax.device_put(tokens_for(batch, seq))

    def run(n):
        loss = None
        for _ in range(n):
            params, opt_state, loss = step(*holder["state"], tokens)
            holder["state"] = (params, opt_state)
        jax.block_until_ready(loss)

    return run


# --------------------------------------------------------------------------------------------
# PyTorch eager
# --------------------------------------------------------------------------------------------


def torch_runner(d, layers, batch, seq):
    """``run(n)``: ``n`` eager PyTorch steps of the same GPT (None without torch)."""
    if torch is None:
        return None
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
            self.fc1, self.fc2 = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

        def forward(self, x):
            b, t, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
            q, k, v = (z.view(b, t, d // HEAD_DIM, HEAD_DIM).transpose(1, 2) for z in (q, k, v))
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(attn.transpose(1, 2).reshape(b, t, d))
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x)), approximate="tanh"))

    class GPT(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = torch.nn.Embedding(VOCAB, d), torch.nn.Embedding(seq, d)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = torch.nn.LayerNorm(d)
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight",
                                                                          "fc2.weight")) else 0.02
                    torch.nn.init.normal_(p, std=std)
                elif name.endswith("bias") and "ln" not in name:
                    torch.nn.init.zeros_(p)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for block in self.blocks:
                x = block(x)
            logits = self.ln_f(x) @ self.wte.weight.T  # tied head
            return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))

    model = GPT()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WD},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=LR, betas=BETAS, eps=EPS)
    tokens = torch.from_numpy(tokens_for(batch, seq).astype(np.int64))
    idx, targets = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def run(n):
        for _ in range(n):
            opt.zero_grad(set_to_none=True)
            loss = model(idx, targets)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            opt.step()
        loss.item()

    return run


# --------------------------------------------------------------------------------------------


def matmul_peak(probes: int = 3) -> float:
    """Best fp32 FLOP/s over ``probes`` rounds of 1024^3 and 2048^3 jnp.matmul probes."""
    return max(measure_matmul_peak("float32", size=n, repeats=10)
               for _ in range(probes) for n in (1024, 2048))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (medians)")
    parser.add_argument("--steps", type=int, default=5, help="steps per contestant per round")
    parser.add_argument("--shapes", nargs="*", default=[",".join(map(str, s)) for s in SHAPES],
                        help="d_model,n_layers,batch,seq ...")
    parser.add_argument("--variants", default="default,bias",
                        help="attnlab models, comma-separated: default (bias-free), bias "
                             "(model.linear_bias), autodiff_norm / bias_autodiff_norm (norms "
                             "differentiated by autodiff, attnlab's first norms), rmsnorm")
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch column")
    args = parser.parse_args()
    use_torch = torch is not None and not args.no_torch
    if use_torch:
        torch.set_num_threads(os.cpu_count())

    print(f"# jax {jax.__version__}, {os.cpu_count()} CPUs, "
          f"{platform.processor() or platform.machine()}; torch "
          f"{torch.__version__ + f' ({torch.get_num_threads()} threads)' if use_torch else 'not used'}"
          f"{'' if torch is not None else ' (not installed: pip install -e .[bench])'}")
    print(f"# XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}; load before: {os.getloadavg()}")
    peak = matmul_peak()
    print(f"# fp32 matmul peak (best of 3 x 1024^3/2048^3 probes): {peak / 1e9:.1f} GFLOP/s")
    variants = [v for v in args.variants.split(",") if v]
    summary = []
    for shape in args.shapes:
        d, layers, batch, seq = map(int, shape.split(","))
        runners = {}
        for v in variants:
            runners[f"attnlab[{v}]"], cfg = attnlab_runner(d, layers, batch, seq, v)
        runners["naive-jax"] = naive_runner(d, layers, batch, seq)
        if use_torch:
            runners["pytorch"] = torch_runner(d, layers, batch, seq)
        flops = training_flops_per_token(cfg)["mfu"]  # per token, attnlab's MFU count
        for run in runners.values():  # compile + warm-up
            run(2)
        times = {name: [] for name in runners}
        print(f"\n## d_model {d}, layers {layers}, batch {batch}, seq {seq}")
        for r in range(args.rounds):
            for name, run in runners.items():
                start = time.perf_counter()
                run(args.steps)
                times[name].append((time.perf_counter() - start) / args.steps)
            load = os.getloadavg()
            print(f"round {r}: load {load[0]:.2f} | " + " | ".join(
                f"{name} {batch * seq / times[name][-1]:,.0f} tok/s" for name in runners),
                flush=True)
        tok = {name: batch * seq / statistics.median(t) for name, t in times.items()}
        summary.append(((d, layers, batch, seq), tok, flops))
        print("| contestant | median tok/s | fraction of peak | vs naive-jax | vs pytorch |")
        print("|---|---|---|---|---|")
        for name, value in tok.items():
            vs_torch = f"{value / tok['pytorch']:.2f}" if "pytorch" in tok else "n/a"
            print(f"| {name} | {value:,.0f} | {value * flops / peak:.2f} | "
                  f"{value / tok['naive-jax']:.2f} | {vs_torch} |")
    print(f"\n# load after: {os.getloadavg()}")
    if not use_torch:
        print("# PyTorch column skipped: "
              + ("--no-torch" if torch is not None else "torch not installed"))


if __name__ == "__main__":
    main()
