"""The model and data of torchft-lite and its checkpoint-restart baseline ddp-restart.

Both trainers train the same model on the same batches, so their runs differ
only in how they recover. The data is synthetic and deterministic: batch
``(seed, step, replica)`` can always be rebuilt, so two runs with the same spec
see the same tokens. Each sequence is an arithmetic progression modulo the
vocabulary, which a small decoder learns quickly, so the loss curve visibly
falls.

Each function imports torch itself: the trainers import this module before
their ``start`` event and torch after it, and ddp-restart's launcher, which
imports it too, never needs torch.
"""

from __future__ import annotations


def make_batch(seed: int, step: int, replica: int, batch_size: int, seq_len: int, vocab: int):
    import torch

    g = torch.Generator().manual_seed((seed * 1_000_003 + step) * 1009 + replica)
    start = torch.randint(0, vocab, (batch_size, 1), generator=g)
    stride = torch.randint(1, 8, (batch_size, 1), generator=g)
    seq = (start + stride * torch.arange(seq_len + 1)) % vocab
    return seq[:, :-1], seq[:, 1:]


def build_model(m):
    import torch
    from torch import nn

    class TinyDecoder(nn.Module):
        """Token + position embeddings, causal transformer blocks, a linear head."""

        def __init__(self) -> None:
            super().__init__()
            self.tok = nn.Embedding(m["vocab_size"], m["dim"])
            self.pos = nn.Embedding(m["seq_len"], m["dim"])
            layer = nn.TransformerEncoderLayer(
                m["dim"], m["heads"], 4 * m["dim"], dropout=0.0, batch_first=True, norm_first=True
            )
            self.blocks = nn.TransformerEncoder(layer, m["layers"], enable_nested_tensor=False)
            self.norm = nn.LayerNorm(m["dim"])
            self.head = nn.Linear(m["dim"], m["vocab_size"])
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(m["seq_len"]), persistent=False)

        def forward(self, x):
            h = self.tok(x) + self.pos(torch.arange(x.shape[1]))
            h = self.blocks(h, mask=self.mask[: x.shape[1], : x.shape[1]], is_causal=True)
            return self.head(self.norm(h))

    return TinyDecoder()


def init_adamw_state(opt) -> None:
    """Create AdamW's per-parameter state now, as its first ``step`` would (``torch.optim.adam``'s lazy
    init: a CPU float32 ``step`` of 0 and zeroed moments), so a heal can receive the peer's state into it
    in place. The first step's arithmetic is unchanged: AdamW only initialises an empty state."""
    import torch

    for group in opt.param_groups:
        assert not (group["fused"] or group["capturable"]), "init_adamw_state: plain (foreach/for-loop) AdamW only"
        for p in group["params"]:
            st = opt.state[p]
            if not st:
                st["step"] = torch.tensor(0.0, dtype=torch.get_default_dtype())
                st["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                st["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                if group["amsgrad"]:
                    st["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def warm_up_adamw(m) -> None:
    """One throwaway AdamW step: the first one imports and compiles a lot; pay for it before training."""
    import torch

    warm = build_model(m)
    opt = torch.optim.AdamW(warm.parameters(), lr=m["lr"])
    x, y = make_batch(0, 0, 0, 1, m["seq_len"], m["vocab_size"])
    torch.nn.functional.cross_entropy(warm(x).flatten(0, 1), y.flatten()).backward()
    opt.step()
