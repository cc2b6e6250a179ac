"""A stage's params: its section of params.yaml as its frozen config (lib.core.config), by the task's family, and
the sections of the stages after it checked before it starts."""

from lib.core.config import STAGES, ConfigError, from_dict
from lib.core.families import params_family
from lib.tasks import get_task


def stage_config(params: dict, task: str, stage: str):
    """The frozen config of ``stage`` for ``task``, validated."""
    chosen = get_task(task)  # an unknown task name fails first
    tasks = listed_tasks(params)  # the others' names: the index stage checks them, importing each
    if task not in tasks:
        raise ConfigError(f"tasks: {task!r} is not listed in tasks ({tasks!r})")
    section = params.get(task)
    if not isinstance(section, dict) or stage not in section:
        raise ConfigError(f"{task}.{stage}: missing section")
    cls = ({"fetch": chosen.FetchConfig, "prepare": chosen.PrepareConfig}.get(stage)
           or params_family(chosen.family).configs[stage])
    return from_dict(cls, section[stage], f"{task}.{stage}")


def listed_tasks(params: dict) -> list:
    """params.yaml's ``tasks``, a list of at least one name, unchecked: a stage of one task runs no other's code."""
    tasks = params.get("tasks")
    if not isinstance(tasks, list):
        raise ConfigError(f"tasks: expected a list of task names (tasks: [cumsum]), got {tasks!r}")
    if not tasks:
        raise ConfigError("tasks: empty, so `dvc repro` builds nothing; list a task or more (tasks: [cumsum])")
    return tasks


def check_tasks(params: dict) -> list[str]:
    """params.yaml's ``tasks``: a list of known task names, at least one, each once. A misspelt name would stop
    `dvc repro` at its stages' missing params: said here, by the index stage, the first that runs."""
    tasks = listed_tasks(params)
    for name in tasks:
        get_task(name)  # a misspelt name is named here
    if len(set(tasks)) < len(tasks):
        raise ConfigError(f"tasks: {tasks!r} names a task twice")
    return tasks


def check_stages_after(params: dict, task: str, stage: str):
    """The params of the stages after ``stage``, validated as each will validate its own, and what they ask of
    the model that train builds: so that a mistake in them is named before ``stage``'s work is done (a multi30k
    training of tens of minutes, then an evaluate section that fails). The stages before ``stage`` have run,
    or their outputs came from elsewhere (``dvc pull``): their params, and a local source that fetch read, are
    not asked for."""
    try:
        # From ``stage`` on: its own section the stage has checked already, but train's is read below
        cfgs = {name: stage_config(params, task, name) for name in STAGES[STAGES.index(stage):]}
        train, evaluate, report = (cfgs.get(name) for name in ("train", "evaluate", "report"))
        params_family(get_task(task).family).check_together(task, train, evaluate, report)
    except ConfigError as err:
        raise ConfigError(f"{err} (found before {stage} starts: each stage checks the params of those after it)"
                          ) from None
