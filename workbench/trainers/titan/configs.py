"""TorchTitan config functions of the workbench's own (``--module workbench.trainers.titan.configs --config <name>``).

torchtitan 0.3.0 picks a run's model through a registry function and lets
flags change the rest; ``model_spec`` is not settable from flags, so a model
the registry lacks needs a function of its own. Each one here starts from the
torchft registry's ``llama3_torchft_debugmodel`` (the trainer, its optimizer,
checkpointer and fault-tolerance sections stay TorchTitan's) and changes only
the model.

``llama3_torchft_tiny``: a classroom's Llama 3. The debug model (dim 256, 6
layers, 6.2M parameters) takes 1.3 s a step on this 2-core CPU at seq_len 256;
this one (dim 64, 2 layers, 4 heads, the offline tokenizer's 2,048 tokens:
0.36M parameters), at seq_len 64 and batch 4 (``configs/titan-cpu-tiny.toml``,
run by ``configs/titan-cpu-light.yaml``), trained at 10.3 committed steps/s per
group with 2 groups of 1 rank (median step 0.08 s; load 2.6) and 4.4 with 2
groups of 2 ranks (median step 0.19 s; load 5.0): one 150-step run each, the
second half's rate.
"""

from __future__ import annotations

import dataclasses
from functools import partial

TINY = {"dim": 64, "n_layers": 2, "n_heads": 4}


def llama3_torchft_tiny():
    """The torchft debug config with a Llama 3 of ``TINY``'s shape and the offline tokenizer's vocabulary."""
    # torchtitan inside: the job process never imports it, and a rank does so after its CPU patches (.rank)
    from torchtitan.experiments.torchft.llama3 import model_registry
    from torchtitan.experiments.torchft.llama3.config_registry import llama3_torchft_debugmodel
    from torchtitan.models.common.config_utils import decoder_vocab_size

    from workbench.trainers.titan.assets import VOCAB_SIZE

    config = llama3_torchft_debugmodel()
    spec = dataclasses.replace(
        model_registry("debugmodel"), flavor="tiny", model=tiny_llama3(vocab_size=VOCAB_SIZE, **TINY)
    )
    config.model_spec = spec
    config.loss.global_vocab_size = decoder_vocab_size(spec)
    return config


def tiny_llama3(*, dim: int, n_layers: int, n_heads: int, vocab_size: int):
    """A ``Llama3Model.Config`` built as torchtitan builds its debug model, from its public config helpers."""
    import torch.nn as nn
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm, compute_ffn_hidden_dim
    from torchtitan.models.common.config_utils import get_attention_config, make_ffn_config, make_gqa_config
    from torchtitan.models.common.param_init import depth_scaled_std
    from torchtitan.models.llama3.model import Llama3Model, Llama3TransformerBlock

    linear = {"weight": partial(nn.init.trunc_normal_, std=0.02), "bias": nn.init.zeros_}
    norm = {"weight": nn.init.ones_}
    s = dim**-0.5
    head = {"weight": partial(nn.init.trunc_normal_, std=s, a=-3 * s, b=3 * s), "bias": nn.init.zeros_}

    def depth(layer: int) -> dict:
        return {"weight": partial(nn.init.trunc_normal_, std=depth_scaled_std(0.02, layer)), "bias": nn.init.zeros_}

    rope = ComplexRoPE.Config(dim=dim // n_heads, max_seq_len=4096, theta=500000, scaling="llama")
    layers = [
        Llama3TransformerBlock.Config(
            attention_norm=RMSNorm.Config(normalized_shape=dim, param_init=norm),
            ffn_norm=RMSNorm.Config(normalized_shape=dim, param_init=norm),
            attention=make_gqa_config(
                dim=dim,
                n_heads=n_heads,
                wqkv_param_init=linear,
                wo_param_init=depth(i),
                inner_attention=get_attention_config("flex"),
                fuse_qkv=True,
                rope=rope,
            ),
            feed_forward=make_ffn_config(
                dim=dim,
                hidden_dim=compute_ffn_hidden_dim(dim, multiple_of=64),
                w1_param_init=linear,
                w2w3_param_init=depth(i),
            ),
        )
        for i in range(n_layers)
    ]
    return Llama3Model.Config(
        dim=dim,
        vocab_size=vocab_size,
        tok_embeddings=Embedding.Config(
            num_embeddings=vocab_size, embedding_dim=dim, param_init={"weight": partial(nn.init.normal_, std=1.0)}
        ),
        norm=RMSNorm.Config(normalized_shape=dim, param_init=norm),
        lm_head=Linear.Config(in_features=dim, out_features=vocab_size, param_init=head),
        layers=layers,
    )


def llama3_torchft_8b():
    """Config function (``--module workbench.trainers.titan.configs --config llama3_torchft_8b``).

    torchtitan's torchft registry has only the debug model, and ``model_spec``
    is not settable from flags; this is that config with Llama 3 8B.
    """
    # torchtitan inside: the job process never imports it, and a rank does so after its CPU patches (.rank)
    from torchtitan.experiments.torchft.llama3 import model_registry
    from torchtitan.experiments.torchft.llama3.config_registry import llama3_torchft_debugmodel
    from torchtitan.models.common.config_utils import decoder_vocab_size

    config = llama3_torchft_debugmodel()
    config.model_spec = model_registry("8B")
    config.loss.global_vocab_size = decoder_vocab_size(config.model_spec)
    config.hf_assets_path = "./assets/hf/Llama-3.1-8B"
    return config
