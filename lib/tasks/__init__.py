"""The tasks, one class each (lib.tasks.base.Task): task ``<name>`` is the ``Task`` subclass named ``<name>`` in
``lib/tasks/<name>.py``. Loading one task imports its module alone, so a stage of one task never runs (or
depends on) another's code; the index stage alone loads every listed task, and the list of every task is read
from the classes when it is needed (a name not found)."""

import importlib
import pkgutil
from pathlib import Path

from lib.core.config import ConfigError
from lib.tasks.base import Task

HERE = Path(__file__).parent


def _task_named(name) -> Task | None:
    """The Task subclass named ``name`` in lib/tasks/<name>.py, as an instance; None where there is none."""
    if not (isinstance(name, str) and name.isidentifier() and (HERE / f"{name}.py").is_file()):
        return None
    module = importlib.import_module(f"lib.tasks.{name}")
    found = [cls for cls in vars(module).values()
             if isinstance(cls, type) and issubclass(cls, Task) and cls.__module__ == module.__name__
             and cls.name == name]
    return found[0]() if found else None


def task_names() -> list[str]:
    """Every task: each module of lib/tasks that defines a Task subclass named after the module."""
    return sorted(info.name for info in pkgutil.iter_modules([str(HERE)]) if _task_named(info.name))


def get_task(name: str) -> Task:
    if (task := _task_named(name)) is None:
        raise ConfigError(f"tasks: unknown task {name!r} (known: {', '.join(task_names())})")
    return task
