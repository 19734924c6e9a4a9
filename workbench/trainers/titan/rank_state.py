"""The state torchft serves to and loads from a peer group: this rank's alone, with no collective.

torchft heals rank by rank: rank ``r`` of a recovering group fetches from rank
``r`` of a source group, and the sources of one group's ranks may differ.
torchtitan's model ``state_dict()`` and ``load_state_dict()`` are collectives
over the group (its fused-QKV hooks all-gather ``wqkv``), so a serving rank
waited there for a peer that was itself fetching: two 2-rank groups that
started together never committed (problem 4 of :mod:`.hooks`, which installs
this state). Here the model is this rank's shards, read and written in place,
with no hook and no collective, so any subset of a group's ranks can serve or
heal.

torch and torchtitan are imported inside: the rank imports this module before
its CPU patches (:mod:`.cpu_patches`), which must precede torchtitan.
"""

from __future__ import annotations

from workbench.trainers.compat import torch_compat, torchft_compat
from workbench.trainers.kit import local_shard


def local_model_state(modules) -> dict:
    """This rank's shard of every parameter and persistent buffer, by name: the tensors themselves.

    No ``state_dict()`` hook runs (torchtitan's fused-QKV hook all-gathers),
    so nothing here waits for another rank. A DTensor gives its local tensor;
    FSDP2 keeps parameters sharded between steps, where torchft reads and
    writes them.
    """
    out: dict = {}
    for i, module in enumerate(modules):
        prefix = f"{i}." if len(modules) > 1 else ""
        for name, param in module.named_parameters():
            out[prefix + name] = local_shard(param)
        for mod_name, mod in module.named_modules():
            for name, buf in mod.named_buffers(recurse=False):
                if buf is not None and name not in torch_compat.non_persistent_buffers(mod):
                    out[f"{prefix}{mod_name + '.' if mod_name else ''}{name}"] = local_shard(buf)
    return out


def load_local_model_state(modules, state: dict) -> None:
    """Copy a :func:`local_model_state` of the same rank of another group into this rank's shards, in place."""
    import torch  # see the module docstring

    mine = local_model_state(modules)
    if mine.keys() != state.keys():
        raise ValueError(
            f"healed model state has other tensors: missing {sorted(mine.keys() - state.keys())[:3]}, "
            f"extra {sorted(state.keys() - mine.keys())[:3]}"
        )
    bad = [k for k, t in mine.items() if tuple(t.shape) != tuple(state[k].shape)]
    if bad:
        raise ValueError(f"healed model state: shard shapes differ for {bad[:3]} (another sharding?)")
    with torch.no_grad():
        for name, tensor in mine.items():
            tensor.copy_(state[name])


class RankLocalState:
    """The state torchft serves to and loads from a peer group: this rank's alone (see the module docstring).

    The keys torchtitan registers (model, optimizer, lr scheduler, train
    state); the model through :func:`local_model_state`, the others through
    their own ``state_dict``/``load_state_dict``, which are local (the
    optimizer's is the container's cached dict of sharded states).
    """

    def __init__(self, checkpointer) -> None:
        # torchtitan: see the module docstring
        from torchtitan.components.checkpoint import LR_SCHEDULER, MODEL, OPTIMIZER, TRAIN_STATE

        self.states = checkpointer.states
        self.model_key = MODEL
        self.keys = [k for k in (MODEL, OPTIMIZER, LR_SCHEDULER, TRAIN_STATE) if k in self.states]

    def modules(self) -> list:
        return self.states[self.model_key].model

    def state_dict(self) -> dict:
        return {
            k: local_model_state(self.modules()) if k == self.model_key else self.states[k].state_dict()
            for k in self.keys
        }

    def load_state_dict(self, state: dict) -> None:
        for k, v in state.items():
            if k == self.model_key:
                load_local_model_state(self.modules(), v)
            else:
                self.states[k].load_state_dict(v)

    def install(self, manager) -> None:
        """Replace the pair torchtitan registered (``set_state_dict_fns``) with this one."""
        keys = torchft_compat.state_dict_keys(manager)
        if len(keys) != 1:
            raise RuntimeError(f"expected torchtitan's one state-dict pair, found {keys}")
        torchft_compat.replace_state_dict_fn(manager, keys[0], self.load_state_dict, self.state_dict)
