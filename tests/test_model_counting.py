"""Parameter counts against the real nnx.Param leaves and against hand-worked numbers; FLOPs."""

import itertools

import pytest

from attnlab.config import ModelConfig
from attnlab.model import count_state_params, flops_per_token, init_model, param_counts

# A grid over everything that changes the parameter count (shapes kept tiny and shared).
VARIANTS = [
    dict(pos_encoding=pe, norm=norm, norm_position=where, ffn=ffn, tie_embeddings=tie,
         qk_norm=qk, n_kv_heads=kv)
    for pe, norm, where, ffn, tie, qk, kv in [
        ("rope", "layernorm", "pre", "gelu", True, False, None),
        ("learned", "rmsnorm", "post", "relu", False, True, 2),
        ("learned", "layernorm", "pre", "swiglu", True, True, 1),
        ("alibi", "rmsnorm", "pre", "swiglu", False, False, 2),
        ("sinusoidal", "layernorm", "post", "gelu", False, True, None),
        ("none", "rmsnorm", "pre", "relu", True, False, 1),
    ]
] + [dict(d_ff=24, ffn="swiglu"), dict(d_ff=40, ffn="gelu", n_layers=3), dict(ffn="geglu"),
     dict(embedding_norm=True, pos_encoding="alibi"),
     dict(embedding_norm=True, norm="rmsnorm", norm_position="post", pos_encoding="learned")]


@pytest.mark.parametrize("overrides", VARIANTS, ids=[str(i) for i in range(len(VARIANTS))])
def test_closed_form_counts_equal_the_model_parameters(overrides):
    base = dict(vocab_size=32, d_model=16, n_layers=2, n_heads=4, max_len=8)
    cfg = ModelConfig(**{**base, **overrides})
    _, state = init_model(cfg, seed=0)
    counts = param_counts(cfg)
    actual = count_state_params(state)
    assert actual == {k: counts[k] for k in ("total", "embedding", "non_embedding")}
    assert counts["total"] == counts["embedding"] + counts["non_embedding"]


def test_hand_worked_counts_for_a_one_million_parameter_model():
    # Defaults: gelu, layernorm, pre-LN, tied, rope.
    cfg = ModelConfig(vocab_size=256, d_model=128, n_layers=4, n_heads=4)
    counts = param_counts(cfg)
    # per layer: attention 4 d^2 = 65536, FFN 2 d (4d) = 131072, two LayerNorms 4 d = 512
    assert counts["per_layer"] == 65536 + 131072 + 512
    assert counts["non_embedding"] == 4 * 197120 + 256  # + final LayerNorm
    assert counts["embedding"] == 256 * 128
    assert counts["total"] == 788736 + 32768
    # Kaplan's approximation N ~ 12 n_layers d^2 ignores the norms.
    assert abs(counts["non_embedding"] / (12 * 4 * 128**2) - 1) < 0.01


def test_embedding_convention_tied_untied_learned():
    base = dict(vocab_size=256, d_model=64, n_layers=2, n_heads=4, max_len=512)
    tied = param_counts(ModelConfig(**base))
    untied = param_counts(ModelConfig(**base, tie_embeddings=False))
    learned = param_counts(ModelConfig(**base, pos_encoding="learned"))
    # N (Kaplan) is the same for all three; the head and the position table are embeddings.
    assert tied["non_embedding"] == untied["non_embedding"] == learned["non_embedding"]
    assert untied["embedding"] - tied["embedding"] == untied["output_head"] == 64 * 256
    assert learned["embedding"] - tied["embedding"] == learned["position_embedding"] == 512 * 64


def test_gqa_and_swiglu_counts():
    mqa = param_counts(
        ModelConfig(vocab_size=256, d_model=128, n_layers=1, n_heads=4, n_kv_heads=1)
    )
    assert mqa["attention"] == 2 * 128 * 128 + 2 * 128 * 32  # q, o full; one 32-wide k and v
    swiglu = param_counts(
        ModelConfig(vocab_size=256, d_model=96, n_layers=1, n_heads=4, ffn="swiglu")
    )
    assert swiglu["ffn"] == 3 * 96 * 256  # d_ff = 8/3 * 96 = 256


def test_flops_per_token_hand_worked():
    cfg = ModelConfig(vocab_size=256, d_model=128, n_layers=4, n_heads=4)
    flops = flops_per_token(cfg, seq_len=256)
    n = 788736
    assert flops["kaplan_6n"] == 6 * n
    assert flops["kaplan_attention"] == 6 * 4 * 256 * 128
    assert flops["kaplan"] == 6 * n + 786432
    assert flops["kaplan_causal"] == 6 * n + 786432 / 2
    assert flops["head"] == 6 * 128 * 256
    # Chinchilla forward per token: embeddings 2*256*128; per layer qkv 2*128*384,
    # QK 2*256*128, softmax 3*4*256, AV 2*256*128, out 2*128*128, FFN 2*2*128*512; logits.
    layer = 98304 + 65536 + 3072 + 65536 + 32768 + 262144
    forward = 65536 + 4 * layer + 65536
    assert flops["chinchilla_forward"] == forward == 2240512
    assert flops["chinchilla"] == 3 * forward


def test_flops_grow_with_context_only_through_attention():
    cfg = ModelConfig(vocab_size=256, d_model=64, n_layers=2, n_heads=2, n_kv_heads=1, ffn="swiglu")
    short, long = flops_per_token(cfg, 128), flops_per_token(cfg, 1024)
    assert short["kaplan_6n"] == long["kaplan_6n"]
    assert long["kaplan"] - short["kaplan"] == 6 * 2 * (1024 - 128) * 64
    per_extra_token = 2 * (2 * 64 + 2 * 64 + 3 * 2)  # QK + AV + softmax, per layer, forward
    assert long["chinchilla"] - short["chinchilla"] == 3 * per_extra_token * (1024 - 128)
    for a, b in itertools.pairwise(["kaplan_6n", "kaplan_causal", "kaplan"]):
        assert short[a] < short[b]
