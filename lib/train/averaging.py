"""Checkpoint averaging (sec. 6.1: the base models average the last 5 checkpoints): the weights kept every
``average_every`` steps or at each epoch's end, and model.pt their mean (always, or when it validates better)."""

import logging
from pathlib import Path

from lib.core.sections import TrainConfig
from lib.data.pairs import Pairs
from lib.model import checkpoint
from lib.model.losses import mean_loss
from lib.train.run import Run

log = logging.getLogger(__name__)


def averaging_step(cfg: TrainConfig, step: int) -> bool:
    """Whether train.average_every keeps the weights at ``step``: every N steps, counted back from max_steps
    when it is set, so that the last weights averaged are the final step's."""
    return bool(cfg.average_every) and (cfg.max_steps - step) % cfg.average_every == 0


def keep_for_averaging(run: Run, cfg: TrainConfig):
    """train.average_every: the weights at this step, for averaging; the ones ``average_last`` saves back go."""
    step = run.state["step"]
    run.save_model({"step": step}, run.checkpoint_dir / f"step-{step}.pt")
    if run.ctx.is_main:
        (run.checkpoint_dir / f"step-{step - cfg.average_every * cfg.average_last}.pt").unlink(missing_ok=True)


def averaged_paths(run: Run, cfg: TrainConfig) -> tuple[list[Path], str]:
    """The last ``average_last`` weights saved for averaging, latest first: every ``average_every`` steps, or
    at each epoch's end; and what they are."""
    if cfg.average_every:
        step = run.state["step"]
        latest = step - (step - cfg.max_steps) % cfg.average_every  # the last step averaging_step kept
        last = range(latest, 0, -cfg.average_every)
        paths, unit = [run.checkpoint_dir / f"step-{s}.pt" for s in last], "checkpoints"
    else:
        paths, unit = [run.checkpoint_dir / f"epoch-{e}.pt" for e in range(run.state["epoch"], 0, -1)], "epochs"
    return [path for path in paths[:cfg.average_last] if path.is_file()], unit


def averaged_model(run: Run, cfg: TrainConfig, valid: Pairs) -> Path | None:
    """The average of the last ``average_last`` epochs' (or checkpoints') weights: with train.average
    if_better, only when it validates better than the best.

    Rank 0 alone decides: it wrote the weights, and it alone writes model.pt.
    """
    if not run.ctx.is_main:
        return None
    last, unit = averaged_paths(run, cfg)
    if len(last) < 2:
        return None
    trainee = run.trainee
    trainee.model.load_state_dict(average_weights(last))
    valid_loss = mean_loss(trainee.model, valid, trainee.ids, cfg.max_tokens, trainee.device, cfg.fast)
    log.info("average of the last %d %s: valid loss %.4f (best single epoch %.4f)", len(last), unit, valid_loss,
             run.state["best_valid_loss"])
    run.log(**{"valid/averaged_loss": valid_loss})
    if cfg.average == "if_better" and valid_loss >= run.state["best_valid_loss"]:
        return None
    path = run.checkpoint_dir / "averaged.pt"
    run.save_model({"step": run.state["step"], "valid_loss": valid_loss, f"averaged_{unit}": len(last),
                    **({"average_every": cfg.average_every} if cfg.average_every else {})}, path)
    return path


def average_weights(paths: list[Path]) -> dict:
    """The element-wise mean of several saved models' weights (checkpoint averaging)."""
    states = [checkpoint.load(path, remedy=f"delete {path.parent} to train from the start")["model"]
              for path in paths]
    return {name: sum(state[name].double() for state in states).div(len(states)).to(states[0][name].dtype)
            for name in states[0]}
