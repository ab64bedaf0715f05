"""Dataset loader for the toy lm-eval tasks.

lm-eval resolves `dataset_kwargs.data_files` against the current directory; building the path
from this file's own location makes the tasks work from anywhere (`--include_path recipes/tasks`).
"""

import json
from pathlib import Path

import datasets


def load_jsonl(data_file, **_metadata):
    """Return {"test": Dataset} read from `data_file` beside this module."""
    lines = (Path(__file__).parent / data_file).read_text().splitlines()
    return {"test": datasets.Dataset.from_list([json.loads(line) for line in lines if line.strip()])}
