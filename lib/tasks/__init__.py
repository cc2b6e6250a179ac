"""The tasks, one class each (lib.tasks.base.Task): task ``<name>`` is the ``Task`` subclass named ``<name>`` in
``lib/tasks/<name>.py``. Loading one task imports its module alone, so a stage of one task never runs (or
depends on) another's code; the list of every task is read from the classes when it is needed."""

import importlib
import pkgutil
from pathlib import Path

from lib.core.config import ConfigError
from lib.tasks.base import Task

HERE = Path(__file__).parent


def _task_in(module_name: str, name: str | None = None) -> Task | None:
    """The Task subclass defined in module ``module_name`` (named ``name``, if given), as an instance."""
    module = importlib.import_module(f"lib.tasks.{module_name}")
    found = [cls for cls in vars(module).values()
             if isinstance(cls, type) and issubclass(cls, Task) and cls.__module__ == module.__name__ and cls.name
             and (name is None or cls.name == name)]
    return found[0]() if found else None


def task_names() -> list[str]:
    """Every task: each module of lib/tasks that defines a Task subclass named after the module."""
    names = [info.name for info in pkgutil.iter_modules([str(HERE)])]
    return sorted(name for name in names if _task_in(name, name) is not None)


def check_task_name(name: str):
    if not (isinstance(name, str) and name.isidentifier() and (HERE / f"{name}.py").is_file()
            and _task_in(name, name) is not None):
        raise ConfigError(f"tasks: unknown task {name!r} (known: {', '.join(task_names())})")


def get_task(name: str) -> Task:
    check_task_name(name)
    return _task_in(name, name)
