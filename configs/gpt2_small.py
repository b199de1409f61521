"""GPT-2 small (124M) shape for users with accelerators: 12 layers, d=768, 12 heads, 1024 context.

Uses the GPT-2 BPE-sized vocabulary shape with a locally trained BPE (tokenizers) and learned
positions, as in Radford et al. 2019; bf16 compute. On a CPU this is only useful for model-info.
"""

from attnlab.config import base_config_dict


def get_config():
    config = base_config_dict()
    config.name = "gpt2_small"

    config.model.vocab_size = 50304  # 50257 rounded up to a multiple of 64, as nanoGPT does
    config.model.d_model = 768
    config.model.n_layers = 12
    config.model.n_heads = 12
    config.model.max_len = 1024
    config.model.pos_encoding = "learned"
    config.model.ffn = "gelu"
    config.model.tie_embeddings = True
    config.model.dtype = "bfloat16"
    config.model.attention_impl = "xla"

    config.data.source = "pystdlib"
    config.data.tokenizer = "bpe"
    config.data.bpe_vocab_size = 50304
    config.data.seq_len = 1024
    config.data.batch_size = 32

    config.train.steps = 20000
    config.train.learning_rate = 6e-4
    config.train.warmup_steps = 700
    config.train.weight_decay = 0.1
    config.train.grad_accum = 4
    config.train.eval_every = 500
    config.train.checkpoint_every = 1000
    return config
