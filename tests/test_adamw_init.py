"""AdamW's state created up front (``init_adamw_state``, so a heal can receive into it in place) gives the
same training as AdamW's own lazy initialisation, bit for bit."""

import torch

from workbench.trainers.lite.model import build_model, init_adamw_state, make_batch

M = {"vocab_size": 64, "dim": 32, "layers": 2, "heads": 2, "seq_len": 16, "lr": 1e-2, "batch_size": 2}


def _train(pre_init: bool, steps: int = 3) -> dict:
    torch.manual_seed(0)
    model = build_model(M)
    opt = torch.optim.AdamW(model.parameters(), lr=M["lr"])
    if pre_init:
        init_adamw_state(opt)
        assert all(len(opt.state[p]) == 3 for p in model.parameters())
    for step in range(steps):
        x, y = make_batch(0, step, 0, M["batch_size"], M["seq_len"], M["vocab_size"])
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict()}


def test_pre_created_adamw_state_trains_bit_for_bit_like_lazy_init():
    lazy, pre = _train(False), _train(True)
    for k, v in lazy["model"].items():
        assert torch.equal(v, pre["model"][k]), k
    for i, st in lazy["optim"]["state"].items():
        for k, v in st.items():
            assert v.dtype == pre["optim"]["state"][i][k].dtype and torch.equal(v, pre["optim"]["state"][i][k]), (i, k)
