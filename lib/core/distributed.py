"""Data-parallel training through PyTorch's own engine: torchrun + DistributedDataParallel.

Launched by torchrun (WORLD_SIZE > 1 in the environment), every process
builds the same global batch from the same seed and trains on its own slice
of it (rows rank, rank + world, ...); DDP averages the gradients, so the
update is the single-process one on the whole batch (dropout aside: each
process draws masks of its own, ``seed_own_stream``). Only rank 0 writes
checkpoints, metrics and logs. Warnings come once a machine, from its first
process (local rank 0): the processes read the same data with the same params,
so the warnings about those are alike, but one can be a machine's own (a CPU
without native bfloat16), and each machine's launcher shows only its own
processes' output. The other processes log errors only.
Backends: nccl on CUDA, gloo on CPU.

    torchrun --standalone --nproc_per_node 8 -m stages.train multi30k ...        # 8 GPUs, one machine
    torchrun --nnodes 2 --nproc_per_node 8 \\
             --rdzv_backend c10d --rdzv_endpoint HOST:29500 -m stages.train ...   # 2 machines, the same on each
"""

import contextlib
import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


@dataclass(frozen=True)
class Context:
    rank: int
    world: int
    device: torch.device  # where collective tensors live (nccl needs them on the GPU)

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup(device: torch.device) -> Context:
    """Join torchrun's process group when launched by it; a single process otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Context(0, 1, device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if dist.get_rank() != 0:  # rank 0 speaks for all; a machine's first process warns; the rest say what fails
        first_on_machine = os.environ.get("LOCAL_RANK", "0") == "0"
        logging.getLogger("lib").setLevel(logging.WARNING if first_on_machine else logging.ERROR)
    return Context(dist.get_rank(), world, device)


def device_named(name: str | torch.device, param: str = "device") -> torch.device:
    """"auto" (CUDA where there is a GPU, else Apple silicon's MPS where there is one, else the CPU), "cpu",
    "cuda", "cuda:1", "mps", ... or a torch.device. A name that is no device, one this toolkit does not run on
    (meta, ...), or a GPU this machine lacks is a ValueError naming ``param`` (not, say, a checkpoint that
    fails to load onto it)."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if torch.backends.mps.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        raise ValueError(f"{param} {name!r}: not a device (auto, cpu, cuda, cuda:N, mps, ...)") from None
    if device.type == "cpu":
        return torch.device("cpu")  # one CPU however named: torch.load cannot map a checkpoint onto "cpu:0"
    if device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"{param} {name!r}: no Apple-silicon GPU (MPS) is available here ({param} auto takes "
                             "the CPU then)")
        return torch.device("mps")
    if device.type != "cuda":
        raise ValueError(f"{param} {name!r}: not a device this toolkit runs on (auto, cpu, cuda, cuda:N, mps)")
    if not torch.cuda.is_available():
        raise ValueError(f"{param} {name!r}: no CUDA device is available here ({param} auto takes the CPU then)")
    if device.index is not None and device.index >= (count := torch.cuda.device_count()):
        raise ValueError(f"{param} {name!r}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}")
    return device


def local_device(device: torch.device) -> torch.device:
    """Under torchrun each process takes the GPU of its local rank: a machine needs one for each process
    torchrun starts there (CUDA's own word for a missing one, "invalid device ordinal", names neither)."""
    if device.type == "cuda" and "LOCAL_RANK" in os.environ:
        local, count = os.environ["LOCAL_RANK"], torch.cuda.device_count()
        if not local.isdigit() or int(local) >= count:
            raise ValueError(f"LOCAL_RANK={local!r} in the environment: this machine has {count} CUDA device(s), one "
                             f"for each process on it: start at most {count} here (torchrun --nproc_per_node "
                             f"{count}), or set train.device: cpu")
        device = torch.device("cuda", int(local))
        torch.cuda.set_device(device)
    return device


RANK_SEED_STEP = 0x9E3779B9  # odd (2**32 / the golden ratio): rank r's seed is r of them past train.seed's


def seed_own_stream(seed: int, ctx: Context):
    """Give each process dropout masks of its own.

    Every process seeds torch with ``seed`` to build the same model. From
    then on the default generators (the CPU's and the GPU's) feed dropout
    alone, and processes drawing from one stream would drop the same units of
    their rows: an LM's slices of a batch have one shape, so every process
    would draw the very same masks. Rank 0 goes on with the stream of a single
    process, which thus trains as it always has.

    The CPU's generator (a Mersenne twister) keeps only a seed's low 32 bits:
    ``seed + rank * 2**32`` gave every process the very same stream there. The
    ranks' seeds step by an odd number modulo 2**32, so no two ranks share one.
    """
    if ctx.rank > 0:
        torch.manual_seed((seed + ctx.rank * RANK_SEED_STEP) % 2**32)


def random_states(ctx: Context) -> list[dict]:
    """Every process's default generators' states, by rank, for a checkpoint: what dropout draws next."""
    mine = {"cpu": torch.get_rng_state()}
    if ctx.device.type == "cuda":
        mine["cuda"] = torch.cuda.get_rng_state(ctx.device)
    if ctx.world == 1:
        return [mine]
    states = [None] * ctx.world
    dist.all_gather_object(states, mine)
    return states


def restore_random_state(states: list[dict], ctx: Context):
    """This process's state from a checkpoint's ``random_states``. A process it has none for (the run that
    saved it had fewer) keeps the stream ``seed_own_stream`` gave it, and so does a GPU's generator when the
    run that saved it had none (``device: auto`` on another machine)."""
    if ctx.rank >= len(states):
        return
    torch.set_rng_state(states[ctx.rank]["cpu"])
    if ctx.device.type == "cuda" and "cuda" in states[ctx.rank]:
        torch.cuda.set_rng_state(states[ctx.rank]["cuda"], ctx.device)


def wrap(model: torch.nn.Module, ctx: Context, device: torch.device) -> torch.nn.Module:
    """The model to run forward and backward through: DDP when there are several processes."""
    if ctx.world == 1:
        return model
    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def accumulating(model: torch.nn.Module, last: bool):
    """The context of one of a step's backward passes: all but the step's last keep their gradients in
    this process, adding to them (DDP's ``no_sync``), so that DDP averages the step's sum once, at its
    last batch."""
    if last or not hasattr(model, "no_sync"):  # a single process has nothing to hold back
        return contextlib.nullcontext()
    return model.no_sync()


def shard(rows: list, ctx: Context) -> tuple[list, float]:
    """This process's slice of a global batch, and the weight of its loss.

    A batch with fewer rows than processes leaves some without rows: they
    compute the first row with weight 0, so that every process still joins
    the gradient all-reduce.
    """
    mine = rows[ctx.rank::ctx.world]
    return (mine, 1.0) if mine else (rows[:1], 0.0)


def sum_over_processes(value: torch.Tensor, ctx: Context) -> torch.Tensor:
    if ctx.world > 1:
        value = value.clone()
        dist.all_reduce(value)
    return value


def from_main(value: float, ctx: Context) -> float:
    """Rank 0's value on every process (e.g. elapsed time, so that all stop at the same epoch)."""
    if ctx.world == 1:
        return value
    tensor = torch.tensor([value], dtype=torch.float64, device=ctx.device)
    dist.broadcast(tensor, src=0)
    return tensor.item()


def barrier(ctx: Context):
    if ctx.world > 1:
        dist.barrier()


def leave(ctx: Context):
    """Destroy the process group once training is done, on every process. Left to the interpreter's
    exit, gloo's worker threads may still hold tensors while Python shuts down, and a process that has
    finished its work may abort (SIGABRT; pytorch#179291). Even
    after this, the interpreter's teardown aborted a finished process now and then, so a stage under
    torchrun ends without it (``lib.stage.cli._exit``)."""
    if ctx.world > 1 and dist.is_initialized():
        dist.destroy_process_group()
