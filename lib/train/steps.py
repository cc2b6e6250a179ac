"""What both training loops do at every step: set the learning rate, clip, read the loss back, time the step."""

import time

import torch

from lib.model.hardware import speed


def set_lr(optimizer: torch.optim.Optimizer, lr: float):
    for group in optimizer.param_groups:
        group["lr"] = lr


def clip(parameters, clip_norm: float) -> torch.Tensor:
    """The gradients' global norm, before clipping them to ``clip_norm`` (0: no clipping, the norm only)."""
    parameters = list(parameters)
    if not clip_norm:
        return torch.nn.utils.get_total_norm([p.grad for p in parameters if p.grad is not None], foreach=True)
    return torch.nn.utils.clip_grad_norm_(parameters, clip_norm, foreach=True)


def read_back(*scalars: torch.Tensor) -> list[float]:
    """A step's loss and gradient norm on the host: its one wait for the device, once backward and clipping
    are queued and before the optimizer's step (so that a NaN never reaches the weights)."""
    return [value.item() for value in scalars]


class Readings:
    """Each step's loss and gradient norm, left on the device and read back every train.log_every steps in one
    wait, then logged with the step's learning rate and speed: meanwhile the host queues the next steps. The
    loop reads back before it saves any weights, so that a NaN loss stops the run before a checkpoint holds it."""

    def __init__(self, run, every: int):
        self.run, self.every, self.pending = run, every, []

    def add(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor, lr: float, tokens: int, flops: float):
        self.pending.append((step, loss, grad_norm, lr, tokens, flops))

    def due(self, step: int) -> bool:
        return step % self.every == 0

    def flush(self, clock: "StepClock") -> float | None:
        """Read back and log the pending steps, each its share of the time since the last read-back (a NaN loss
        named by its step); the last loss, or None when none was pending."""
        if not self.pending:
            return None
        values = torch.stack([torch.stack([loss, norm.to(loss.dtype)]) for _, loss, norm, *_ in self.pending])
        seconds, peak = clock.lap() / len(self.pending), self.run.trainee.peak_tflops
        for (step, _, _, lr, tokens, flops), (loss, grad_norm) in zip(self.pending, values.tolist()):
            self.run.check_finite(loss, step)
            self.run.curves.log(step, **{"train/loss": loss, "train/lr": lr, "train/grad_norm": grad_norm,
                                         **speed(tokens, flops, seconds, peak)})
        self.pending = []
        return loss


class StepClock:
    """Each step's wall time, from the previous step's read-back to its own, so that the steps' times add up
    to the time spent training (logging and collating included). ``pause`` before anything else (validation,
    a checkpoint): the next step then counts from its own start. ``spent`` is the run's other clock: all the
    time since it was last asked (validation and checkpoints included), for the time budget."""

    def __init__(self):
        self.mark = None
        self.spent_from = time.perf_counter()

    def spent(self) -> float:
        now = time.perf_counter()
        seconds, self.spent_from = now - self.spent_from, now
        return seconds

    def unspent(self) -> float:
        """The time since ``spent`` was last asked, leaving it to count on."""
        return time.perf_counter() - self.spent_from

    def start(self):
        if self.mark is None:
            self.mark = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        seconds, self.mark = now - self.mark, now
        return seconds

    def pause(self):
        self.mark = None
