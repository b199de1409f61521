"""The figure of docs/results.md's GPT vs BERT vs T5 section: the common measure (bits per byte of
the masked spans, ``val_span_bits``) against non-embedding parameters, one IsoFLOP profile per
(objective, budget).

    python docs/scripts/gpt_vs_bert_plot.py sweeps/gpt_vs_bert docs/results/gpt_vs_bert.png
"""

import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from attnlab import results  # noqa: E402

STYLE = {"decoder": "tab:blue", "encoder": "tab:orange", "encoder_decoder": "tab:green"}
MARKERS = {1e10: "o", 3e10: "s", 1e11: "^"}


def main(sweep: str, out: str) -> None:
    df = results.load(sweep)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for (stack, budget), group in df.groupby(["stack", "budget"]):
        group = group.sort_values("non_embedding_params")
        ax.plot(group["non_embedding_params"], group["val_span_bits"], color=STYLE[stack],
                marker=MARKERS.get(budget, "x"), label=f"{stack}, C = {budget:.0e}")
    ax.set_xscale("log")
    ax.set_xlabel("non-embedding parameters N (the encoder-decoder: both stacks)")
    ax.set_ylabel("bits per byte of the masked spans")
    ax.set_title("GPT vs BERT vs T5 at equal compute (pystdlib bytes, seq 64)")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:3])
