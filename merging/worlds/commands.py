"""What the worlds' command lines share."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path


def add_tasks_command(world_commands, help_text: str, world_package) -> None:
    """Add `logitcomp <world> tasks DIR`, calling the world package's (lazily exported) `write_task_files`."""
    tasks = world_commands.add_parser("tasks", help=help_text)
    tasks.add_argument("dir", metavar="DIR")
    tasks.set_defaults(func=lambda args: _write_tasks(world_package.write_task_files, Path(args.dir)))


def _write_tasks(write_task_files: Callable, folder: Path) -> int:
    for path in write_task_files(folder):
        print(path)
    return 0
