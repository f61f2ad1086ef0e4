"""A FAKE at the GPU boundary, for spawned test ranks only: lets megatron-core's optimizer run on CPU.

megatron's optimizer modules allocate small bookkeeping tensors with the string literal `device='cuda'`
and check `param.type() == 'torch.cuda.FloatTensor'` (see docs/FACTS.md). Nothing about the math
needs a GPU, so for tests the names `torch.tensor` / `torch.zeros` inside those modules drop the
`device` argument and `Tensor.type()` reports CUDA type names. Everything else (DDP, reduce-scatter,
all-gather over gloo, the sharded AdamW step) is megatron's real code. Installed per process by
`install()`; call it only in a rank spawned by hpcrl.distributed.spawn.run_ranks (the patch dies with it).
"""

from __future__ import annotations

import torch


class _TorchWithoutDevice:
    """`torch`, except that tensor()/zeros() ignore `device=` (megatron passes 'cuda' literally)."""

    def __getattr__(self, name: str):
        return getattr(torch, name)

    @staticmethod
    def tensor(*args, device=None, **kwargs):  # noqa: ARG004
        return torch.tensor(*args, **kwargs)

    @staticmethod
    def zeros(*args, device=None, **kwargs):  # noqa: ARG004
        return torch.zeros(*args, **kwargs)


def install() -> None:
    import megatron.core.optimizer.clip_grads as clip_grads
    import megatron.core.optimizer.distrib_optimizer as distrib_optimizer
    import megatron.core.optimizer.grad_scaler as grad_scaler
    import megatron.core.optimizer.optimizer as optimizer
    import megatron.core.utils as utils

    for module in (clip_grads, distrib_optimizer, grad_scaler, optimizer, utils):
        module.torch = _TorchWithoutDevice()
    real_type = torch.Tensor.type

    def cuda_type_names(self, *args, **kwargs):
        if args or kwargs:
            return real_type(self, *args, **kwargs)
        return real_type(self).replace("torch.", "torch.cuda.")

    torch.Tensor.type = cuda_type_names
