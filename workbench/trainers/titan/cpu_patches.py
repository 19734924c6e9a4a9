"""Make torchtitan 0.3.0 train on a CPU-only torch.

torchtitan targets accelerators; on a CPU build of torch (2.13.0) its training
entry point fails at five places, in this order, and at a sixth with more than
one rank per replica group. Each patch below works around
exactly one of them, is named after the upstream failure, and is applied inside
every training process before the trainer is built (``apply()`` is called by
``workbench.trainers.titan.job`` when no accelerator is present; nothing is patched
on a GPU machine).

``tests/test_titan.py`` reproduces each upstream failure without its patch and
shows it gone with it, so a torchtitan upgrade that fixes one is noticed (the
reproduction stops failing) and the patch can be deleted.

The patches must run in order: the device patch has to precede any import of
a torchtitan module that copies ``device_type``/``device_module`` at import.
So every torchtitan import is inside its patch, as are the torch modules that
``import torch`` does not load and only a patch uses (flex attention, FSDP).
"""

from __future__ import annotations

import importlib.util
import os
import resource
import sys
import types
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F

from workbench.trainers.compat import torch_compat, torchtitan_compat

KERNELS_MODULE = "torchtitan.distributed.minimal_async_ep.kernels"


def no_module_named_triton() -> None:
    """``ModuleNotFoundError: No module named 'triton'``.

    ``torchtitan.trainer`` imports quantization, which imports the MoE token
    dispatcher, which imports the triton kernels of asynchronous expert
    parallelism at module level. Dense models never call them, so the kernels
    module is replaced by one whose every name raises when *called*.
    """
    if importlib.util.find_spec("triton") is not None or KERNELS_MODULE in sys.modules:
        return

    stub = types.ModuleType(KERNELS_MODULE, "triton kernels, unavailable: triton is not installed")

    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(name)

        def unavailable(*args, **kwargs):
            raise ModuleNotFoundError(f"{KERNELS_MODULE}.{name} needs triton, which is not installed")

        unavailable.__name__ = name
        return unavailable

    stub.__getattr__ = __getattr__  # PEP 562: resolves `from kernels import x`
    sys.modules[KERNELS_MODULE] = stub


def device_forced_to_cuda() -> None:
    """``tools/utils.py``: ``device_type = _get_available_device_type() or "cuda"``.

    With no accelerator torchtitan picks ``cuda`` anyway, and every module that
    imports ``device_type``/``device_module`` copies the wrong value. Setting
    them to ``cpu``/``torch.cpu`` before those modules are imported fixes all
    copies at once.
    """
    from torchtitan.tools import utils

    utils.device_type, utils.device_module = "cpu", torch.cpu


class CpuMemoryMonitor:
    """The device memory monitor's interface over this process's peak RSS."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = torch.device(device)
        self.device_name = "cpu"
        self.device_index = 0
        self.device_capacity = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        self.device_capacity_gib = self.device_capacity / 2**30

    def get_peak_stats(self):
        from torchtitan.components.metrics import DeviceMemStats

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        gib, pct = peak / 2**30, 100 * peak / self.device_capacity
        return DeviceMemStats(gib, pct, gib, pct, 0, 0)

    def reset_peak_stats(self) -> None:
        pass  # the kernel keeps the peak RSS; it cannot be reset


def torch_cpu_has_no_get_device_name() -> None:
    """``AttributeError: module 'torch.cpu' has no attribute 'get_device_name'``.

    ``components/metrics.py``'s ``DeviceMemoryMonitor`` asks the device module
    for its name, properties and allocator statistics, which ``torch.cpu`` does
    not have; the CPU monitor reports the process's peak RSS instead.
    """
    from torchtitan.components import metrics

    metrics.DeviceMemoryMonitor = CpuMemoryMonitor


def flex_attention_no_backward_on_cpu() -> None:
    """``NotImplementedError: FlexAttention does not support backward on CPU``.

    Language models must use a masked attention backend (``sdpa`` is rejected
    by ``models/common/config_utils.py``), and flex is the only one that runs
    on CPU, forward only. On CPU, ``FlexAttention.forward`` materialises the
    BlockMask's ``mask_mod`` (causal, per-document) as a dense boolean mask and
    calls ``scaled_dot_product_attention``, which has a backward. Exact, and
    cheap at debug-model sequence lengths. The BlockMask itself is then built
    eagerly: torchtitan's ``torch.compile``'d ``create_block_mask`` spent ~40 s
    of the first step in inductor's C++ compiler for a mask only read for its
    ``mask_mod``.
    """
    from torch.nn.attention.flex_attention import create_block_mask, create_mask
    from torchtitan.models.common.attention import FlexAttention

    torchtitan_compat.set_block_mask_builder(create_block_mask)

    if getattr(FlexAttention.forward, "_workbench_cpu", False):
        return
    original = FlexAttention.forward

    def forward(
        self,
        q_BLNH,
        k_BLNH,
        v_BLNH,
        *,
        attention_masks,
        score_mod=None,
        scale=None,
        enable_gqa=False,
        out_transform=None,
        **kwargs,
    ):
        if q_BLNH.device.type != "cpu":
            return original(
                self,
                q_BLNH,
                k_BLNH,
                v_BLNH,
                attention_masks=attention_masks,
                score_mod=score_mod,
                scale=scale,
                enable_gqa=enable_gqa,
                out_transform=out_transform,
                **kwargs,
            )
        if score_mod is not None or out_transform is not None:
            raise NotImplementedError("the CPU attention fallback supports mask_mod only")
        q, k, v = (t.transpose(1, 2) for t in (q_BLNH, k_BLNH, v_BLNH))
        batch, _, q_len, _ = q.shape
        mask = create_mask(attention_masks.mask_mod, batch, 1, q_len, k.shape[2], device=q.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=enable_gqa)
        return out.transpose(1, 2)

    forward._workbench_cpu = True
    FlexAttention.forward = forward


def barrier_device_ids_and_set_timeout() -> None:
    """``distributed/utils.py`` ``set_pg_timeouts``.

    After the first step torchtitan shortens every process group's timeout: it
    calls ``barrier(device_ids=[torch.cpu.current_device()])``, a TypeError on
    CPU (gloo takes no device ids), then ``torch.distributed.set_timeout``,
    which torch 2.13.0 does not have. The CPU version does a plain barrier and
    sets each group's timeout through c10d's ``_set_pg_timeout``
    (:func:`workbench.trainers.compat.torch_compat.set_pg_timeout`).
    """
    from torchtitan.distributed import utils as dist_utils

    def set_pg_timeouts(timeout: timedelta, parallel_dims) -> None:
        dist.barrier()
        groups = [m.get_group() for m in parallel_dims.get_all_one_dimensional_meshes().values()]
        for group in [*groups, None]:
            torch_compat.set_pg_timeout(timeout, group)

    dist_utils.set_pg_timeouts = set_pg_timeouts


def cannot_use_premul_sum_with_gloo() -> None:
    """``RuntimeError: Cannot use ReduceOp.PREMUL_SUM with Gloo``.

    With more than one rank per replica group, FSDP2 reduce-scatters gradients
    with ``PREMUL_SUM(1/factor)`` (torchtitan sets the factor to 1 in
    ``disable_fsdp_gradient_division``), which gloo lacks. Forcing a plain
    ``SUM`` for FSDP's collectives is exact here, as the factor is 1.
    """
    from torch.distributed.fsdp import FSDPModule
    from torchtitan.distributed import fsdp

    if getattr(fsdp.disable_fsdp_gradient_division, "_workbench_cpu", False):
        return
    original = fsdp.disable_fsdp_gradient_division

    def disable_fsdp_gradient_division(model) -> None:
        original(model)
        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.set_force_sum_reduction_for_comms(True)

    disable_fsdp_gradient_division._workbench_cpu = True
    fsdp.disable_fsdp_gradient_division = disable_fsdp_gradient_division


PATCHES = (
    no_module_named_triton,
    device_forced_to_cuda,
    torch_cpu_has_no_get_device_name,
    flex_attention_no_backward_on_cpu,
    barrier_device_ids_and_set_timeout,
    cannot_use_premul_sum_with_gloo,
)


def needed() -> bool:
    return not torch.accelerator.is_available()


_applied = False


def apply() -> None:
    """Apply every patch, in upstream failure order; once per process (a rank forked warm inherits them)."""
    global _applied
    if _applied:
        return
    for patch in PATCHES:
        patch()
    _applied = True
