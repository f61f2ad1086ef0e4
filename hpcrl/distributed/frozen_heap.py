"""Importing this module freezes the importing process's heap (`gc.freeze()`): the last entry of a fork
server's preload list (hpcrl.distributed.spawn.PRELOAD).

Why: a fork server imports torch, megatron-core and transformers once, millions of objects. Each forked
child's first full collection would walk them all and write to their gc headers, so the kernel copies
every page of that heap into every child. Frozen, they sit in the permanent generation, which no
collection visits (the gc docs advise freezing before a fork for this). hpcrl.launcher.rank_server does
the same for its ranks, by calling `gc.freeze()` itself.
"""

import gc

gc.freeze()
