"""What each directory a stage writes holds: the stage replaces it whole (``lib.core.files.atomic_dir``), so a
directory holding anything else is refused, before the work and again as it is replaced."""

from lib.data.sources import MANIFEST
from lib.tasks.base import Task

STOPPED = "stopped.json"  # beside the curves: why training stopped (lib.train.run writes it, the report reads it)
# By stage and --option, as fnmatch patterns. What fetch and prepare write, each task declares (``holds``).
HOLDS = {("tokenize", "out"): ("*.json", "*.ids", "*.lengths"),
         ("train", "checkpoints"): ("*.pt", ".*.tmp"), ("train", "live"): ("metrics.json", "plots", STOPPED),
         ("report", "figures"): ("*.png",)}
TASK_DIRECTORIES = (("fetch", "out"), ("prepare", "out"))


def holds(task: Task, stage: str, option: str) -> tuple[str, ...]:
    """The fnmatch patterns of what the directory ``stage`` writes at ``--option`` holds, for ``task``."""
    if (stage, option) == ("fetch", "out"):
        return (MANIFEST, *task.fetched)
    return task.prepared if (stage, option) == ("prepare", "out") else HOLDS[stage, option]
