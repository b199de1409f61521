"""In-context linear regression (Garg et al. 2022): train a vector Transformer
(``model.inputs=vectors``) on fresh prompts, then its error against the number of in-context
examples k beside least squares, ridge, 3-NN, averaging and one step of GD (float64, on the same
test prompts) and their closed forms.

    python experiments/icl_regression.py --out=runs/icl_regression            # d = 8, k <= 16
    python experiments/icl_regression.py --out=runs/icl_reg_d4 --dim=4 --examples=8 --steps=2000

Writes ``result.json`` (``k``, ``error``, ``stderr``, ``baselines``, ``expected``, the training
record) and ``result.png`` in ``--out``. A plain loop without checkpoints
(:mod:`attnlab.icl.regression`): ``attnlab train`` reads token batches only.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from attnlab.config import ModelConfig, TrainConfig
from attnlab.data import icl
from attnlab.icl import regression


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--examples", type=int, default=16)
    parser.add_argument("--noise", type=float, default=0.0)
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--mixer", default="softmax")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    task = icl.RegressionTask(args.dim, args.examples, args.noise)
    cfg = ModelConfig(inputs="vectors", input_dim=args.dim, d_model=args.d_model,
                      n_layers=args.layers, n_heads=args.heads, pos_encoding="none",
                      mixer=args.mixer, max_len=2 * args.examples)
    train = TrainConfig(steps=args.steps, learning_rate=args.lr, seed=args.seed,
                        warmup_steps=min(200, args.steps // 10), weight_decay=0.0,
                        log_every=max(1, args.steps // 20))
    graphdef, params, record = regression.train(cfg, task, train, batch_size=args.batch_size,
                                                log=lambda line: print(line, flush=True))
    result = regression.evaluate(graphdef, params, task)
    result.update(train=record, args=vars(args), model=cfg.__dict__)
    (out / "result.json").write_text(json.dumps(result, indent=2))
    plot(result, out / "result.png")
    print(f"{'k':>3} {'model':>8} " + " ".join(f"{n[:12]:>12}" for n in result["baselines"]))
    for k in result["k"]:
        print(f"{k:>3} {result['error'][k]:8.4f} "
              + " ".join(f"{v[k]:12.4f}" for v in result["baselines"].values()))
    print(f"trained {args.steps} steps in {record['wall_s']:.0f} s; results: {out}")
    return 0


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    ax.errorbar(result["k"], result["error"], yerr=result["stderr"], fmt="o-", label="model",
                lw=2)
    for name, curve in result["baselines"].items():
        ax.plot(result["k"], curve, "--", label=name)
    ax.axvline(result["dim"], color="gray", ls=":", lw=0.8)
    ax.set_ylim(0, 1.5)
    ax.set_xlabel("in-context examples k")
    ax.set_ylabel("squared error / d")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
