"""The train stage: the loop of the task's model family (lib.train.families), one trainer at a time on its
checkpoints, a device out of memory named by the params that set a batch."""

import contextlib
import os
from pathlib import Path

from lib.core.files import held_alone
from lib.model.device import out_of_memory, out_of_memory_error
from lib.tasks import get_task
from lib.train.families import TRAINING


def run(task, cfg, data_dir, tokenizer_path, model_path, checkpoint_dir, live_dir) -> dict:
    """The train stage: the loop of the task's family, one trainer at a time on ``checkpoint_dir`` (a
    second, a `dvc repro` started while an orphaned one still runs, would interleave their curves)."""
    family = TRAINING[get_task(task).family]
    checkpoint_dir = Path(checkpoint_dir)
    alone = os.environ.get("RANK", "0") == "0"  # under torchrun, rank 0 holds it for the run's processes
    try:
        with held_alone(checkpoint_dir.with_name(checkpoint_dir.name + ".lock"), str(checkpoint_dir)) if alone \
                else contextlib.nullcontext():
            return family.train(task, cfg, data_dir, tokenizer_path, model_path, checkpoint_dir, live_dir)
    except RuntimeError as err:  # torch.OutOfMemoryError is one
        said = out_of_memory(err)
        if not said:
            raise
        raise out_of_memory_error(said, cfg, family.batch(cfg)) from None
