"""Data-parallel lm-eval for models passed in memory, under `torchrun` or `accelerate launch`.

lm-eval's HFLM sets up data parallelism only when it loads a model by name itself: for a model passed
in memory (`LogitcompLM` over a composition, every row of a recipe run) it declares rank 0 of 1, so
under a launcher every process evaluates every request. `DataParallel` reads the launcher's
environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT), joins torch.distributed's process group
(NCCL on GPUs, gloo on CPU) and gives lm-eval the rank, world size and collectives with which its
evaluator splits the requests (document i goes to rank i mod N) and gathers the per-sample metrics.
torch is imported only under a launcher: the runner imports this module and stays torch-free.
"""

from __future__ import annotations

import atexit
import logging
import os
from datetime import timedelta


log = logging.getLogger("lm_eval.logitcomp")  # printed wherever lm-eval prints its own progress


def launched() -> bool:
    """Whether this process is one of several started by a launcher."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def world() -> tuple[int, int]:
    """(rank, world size), joining the launcher's process group on first use; (0, 1) without a launcher."""
    if not launched():
        return 0, 1
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend, timeout=timedelta(weeks=52))  # rank 0 may merge a big model while the others wait
        # left to the interpreter's exit, gloo's threads can abort the process ("terminate called without an active exception")
        atexit.register(dist.destroy_process_group)
    return dist.get_rank(), dist.get_world_size()


def local_device(device: str) -> str:
    """`cuda` means this process's own GPU (LOCAL_RANK) under a launcher; any other device is kept."""
    if launched() and str(device).split(":")[0] == "cuda":
        return f"cuda:{os.environ.get('LOCAL_RANK', '0')}"
    return device


def barrier() -> None:
    """Wait for every rank (nothing without a launcher)."""
    if launched():
        import torch.distributed as dist

        world()
        dist.barrier()


def broadcast(value):
    """Rank 0's `value` on every rank (the value itself without a launcher)."""
    if not launched():
        return value
    import torch.distributed as dist

    world()
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


class DataParallel:
    """Mixin in front of HFLM: call `_join()` after HFLM's __init__. HFLM's `gather_object` already uses
    torch.distributed; `all_gather` and `barrier` go through accelerate's Accelerator, which a model
    passed in memory never gets, so they are replaced here."""

    def _join(self) -> None:
        self._rank, self._world_size = world()

    def all_gather(self, tensor):
        """Every rank's `tensor` concatenated along dim 0 (a scalar counts as shape (1,)), like accelerate's gather."""
        import torch
        import torch.distributed as dist

        if self.world_size <= 1:
            return tensor
        tensor = tensor.reshape(1) if tensor.dim() == 0 else tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor)
        return torch.cat(parts)

    def barrier(self) -> None:
        if self.world_size > 1:
            barrier()

    # each rank says how much of the work it got (lm-eval's own count is a debug line)
    def _count(self, kind: str, requests) -> None:
        if self.world_size > 1:
            log.info("rank %d of %d: %d %s requests", self.rank, self.world_size, len(requests), kind)

    def generate_until(self, requests, *args, **kwargs):
        self._count("generate_until", requests)
        return super().generate_until(requests, *args, **kwargs)

    def loglikelihood(self, requests, *args, **kwargs):
        self._count("loglikelihood", requests)
        return super().loglikelihood(requests, *args, **kwargs)

    def loglikelihood_rolling(self, requests, *args, **kwargs):
        self._count("loglikelihood_rolling", requests)
        return super().loglikelihood_rolling(requests, *args, **kwargs)
