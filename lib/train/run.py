"""A training run's bookkeeping: its counters, resumable checkpoints (last.pt), the best weights (best.pt),
the curves, and model.pt at the end. A kill at any moment loses at most the steps since the last checkpoint."""

import json
import logging
import math
import shutil
from pathlib import Path

from lib.model import checkpoint
from lib.core import distributed
from lib.core.families import params_family
from lib.tasks.outputs import STOPPED
from lib.train.curves import Curves, truncate_curves
from lib.core.files import atomic_path
from lib.train.identity import mismatch, run_identity
from lib.model.losses import perplexity
from lib.model.setup import Trainee

log = logging.getLogger(__name__)


class DivergedError(ValueError):
    """The loss became NaN or infinite; the message names the step and the likely cause."""


class Run:
    """``state`` holds plain counters (step, best validation loss, and the loop's ``counters``); ``generators``
    the torch generators a resume must restore. A checkpoint is resumed only when it shares this run's
    identity (lib.train.identity): so a run after any change that DVC reruns training for starts afresh. Raising
    the length (``length``: the param and the counter it bounds) continues training, unless the schedule
    depends on it (``schedule_uses_length``); ``stop_keys``, params that only decide when to stop, continue it.
    """

    def __init__(self, trainee: Trainee, cfg, optimizer, *, length: tuple[str, str], data_dir, tokenizer_dir,
                 checkpoint_dir, live_dir, counters: dict | None = None, generators: dict | None = None,
                 stop_keys: tuple[str, ...] = (), schedule_uses_length: bool = False):
        length_key, self.progress_key = length
        self.trainee, self.model, self.optimizer, self.ctx = trainee, trainee.model, optimizer, trainee.ctx
        self.state = {"step": 0, "best_valid_loss": math.inf, **(counters or {})}
        self.generators = generators or {}
        self.checkpoint_dir = Path(checkpoint_dir)
        self.last_path, self.best_path = self.checkpoint_dir / "last.pt", self.checkpoint_dir / "best.pt"
        self.identity = run_identity(trainee.task, cfg, length_key, stop_keys, schedule_uses_length, data_dir,
                                     tokenizer_dir)
        self.curves = Curves(live_dir, self.ctx.is_main)
        self.resumed = self._resume(getattr(cfg, length_key))

    def open(self):
        """Start writing: clear an earlier run's outputs, or when resuming drop the curves' rows logged after
        its checkpoint. Called once the loop has checked its data, so that a bad input loses nothing; under
        torchrun only rank 0 writes, once every process has read what it resumes from."""
        distributed.barrier(self.ctx)
        if not self.ctx.is_main:
            return
        if self.resumed:
            truncate_curves(self.curves.live_dir, self.state["step"])
            for stale in self.checkpoint_dir.glob(".*.tmp"):  # a save that kill -9 cut short
                stale.unlink()
        else:
            shutil.rmtree(self.checkpoint_dir, ignore_errors=True)
            shutil.rmtree(self.curves.live_dir, ignore_errors=True)
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self.curves.open(self.resumed)

    def _resume(self, length: int) -> bool:
        if not self.last_path.is_file():
            return False
        remedy = f"delete {self.checkpoint_dir} to train from the start"  # else it stops here at every re-run
        saved = checkpoint.load(self.last_path, remedy=remedy)  # on the CPU, where generators take their state
        reason = mismatch(saved, self.identity, self.progress_key, length)
        if reason:
            log.info("%s: %s; starting afresh", self.last_path, reason)
            return False
        self.model.load_state_dict(saved["model"])
        self.optimizer.load_state_dict(saved["optimizer"])
        distributed.restore_random_state(saved["rng"], self.ctx)
        for name, generator in self.generators.items():
            generator.set_state(saved["generators"][name])
        self.state = {k: saved[k] for k in self.state}
        if self.state["best_valid_loss"] < math.inf:  # it has validated: best.pt must be there and whole
            if not self.best_path.is_file():
                raise ValueError(f"{self.best_path}: not found, though {self.last_path} has validated; {remedy}")
            checkpoint.load(self.best_path, remedy=remedy)
        log.info("resuming from %s at step %d", self.last_path, self.state["step"])
        return True

    def save_last(self):
        rng = distributed.random_states(self.ctx)  # every process's, gathered: they all take part
        if self.ctx.is_main:
            checkpoint.save({"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "rng": rng,
                             "generators": {k: g.get_state() for k, g in self.generators.items()},
                             **self.state, **self.identity}, self.last_path)

    def check_finite(self, loss: float, step: int | None = None):
        """Stop at a NaN or infinite loss, before any weights are saved after it (``step``: the step it came
        from, default the current one)."""
        if not math.isfinite(loss):
            kept = f"the last good checkpoint, {self.last_path}, is kept" if self.last_path.is_file() else \
                "no checkpoint was written yet"
            raise DivergedError(
                f"training diverged at step {step or self.state['step']}: the loss is {loss}. The likely cause is "
                f"a learning rate too high for this model ({params_family(self.trainee.family).lr_param}, "
                f"train.warmup); {kept}")

    def log(self, **metrics):
        self.curves.log(self.state["step"], **metrics)

    def record_validation(self, valid_loss: float, extra: dict) -> bool:
        """Log the validation loss; keep the weights when they are the best so far (then True)."""
        self.log(**{"valid/loss": valid_loss, "valid/perplexity": perplexity(valid_loss)})
        self.curves.summarise()
        if valid_loss >= self.state["best_valid_loss"]:
            return False
        self.state["best_valid_loss"] = valid_loss
        self.save_model({"step": self.state["step"], "valid_loss": valid_loss, **extra}, self.best_path)
        return True

    def save_model(self, extra: dict, path):
        if self.ctx.is_main:
            t = self.trainee
            checkpoint.save_model(self.model, t.family, t.vocab, {**extra, **t.trained_with}, path)

    def record_stop(self, param: str, text: str, **facts):
        """stopped.json beside the curves, for the report: the train ``param`` that stopped the run (``text`` says
        how), at which step and after how many minutes, and the loop's other ``facts``."""
        if self.ctx.is_main:
            stop = {"param": param, "reason": text, "step": self.state["step"], **facts}
            if "elapsed_s" in self.state:  # a loop that keeps the time budget's clock
                stop["minutes"] = round(self.state["elapsed_s"] / 60, 2)
            with atomic_path(Path(self.curves.live_dir) / STOPPED) as tmp:
                tmp.write_text(json.dumps(stop, indent=1) + "\n")

    def finish(self, model_path, source=None) -> dict:
        """Copy ``source`` (default: best.pt) to ``model_path``; under torchrun every process then leaves."""
        self.curves.end()
        if self.ctx.is_main:
            with atomic_path(model_path) as tmp:
                shutil.copyfile(source or self.best_path, tmp)
        distributed.barrier(self.ctx)
        distributed.leave(self.ctx)
        return {"step": self.state["step"], "best_valid_loss": self.state["best_valid_loss"],
                "resumed": self.resumed}
