"""index: reports/index.html, a section per task in params.yaml: tasks, each showing the card its report stage
writes. The first stage `dvc repro` runs, it also checks the task list: a misspelt or empty one is said here."""

from lib.stage.cli import FILE, once_main
from lib.core.files import atomic_path
from lib.report.pages import index_html
from lib.tasks.params import check_tasks
from lib.tasks import get_task


def write_index(params: dict, out: str):
    tasks = check_tasks(params)
    descriptions = {task: get_task(task).description for task in tasks}
    with atomic_path(out) as tmp:
        tmp.write_text(index_html(tasks, descriptions))


def main(argv=None):
    once_main("index", "The index stage: reports/index.html, a section per task.", FILE, write_index, argv)


if __name__ == "__main__":
    main()
