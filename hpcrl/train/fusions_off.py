"""Imported for its effect: megatron's fusion decorators become no-ops in this process when CUDA is absent
(`hpcrl.train.megatron_compat.fusions_off_without_cuda`, patch 6).

A module, not a call, because multiprocessing's fork server can only preload modules by name: the fork
server of `hpcrl.distributed.spawn` imports this one before megatron-core, so megatron's import there
skips compiling its fusions through torch dynamo (~2.5 s of CPU in every process that imports it on a
CPU machine, where the fusions cannot help: the model configs turn them off anyway)."""

from hpcrl.train.megatron_compat import fusions_off_without_cuda

fusions_off_without_cuda()
