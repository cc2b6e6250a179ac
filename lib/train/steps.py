"""What both training loops do at every step: set the learning rate, read the loss back, time the step."""

import time

import torch


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

    def start(self):
        if self.mark is None:
            self.mark = time.perf_counter()

    def lap(self) -> float:
        now = time.perf_counter()
        seconds, self.mark = now - self.mark, now
        return seconds

    def pause(self):
        self.mark = None
