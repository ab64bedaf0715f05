"""CHAMP (Mao et al. 2024, MIT; the `champ-dataset` package on PyPI): competition math problems read from its wheel
(`champ_dataset/dataset_files/v0.json`: no hub). The task keeps the problems whose answer is one integer."""

import re

import datasets

INTEGER = re.compile(r"-?[0-9]+")


def load_champ(**_metadata):
    """{"test": Dataset} of CHAMP's integer-answer problems: identifier, category, question, number."""
    import champ_dataset

    problems = champ_dataset.load("v0").problems.values()
    return {"test": datasets.Dataset.from_list([{"identifier": p.identifier, "category": p.category, "question": p.text, "number": p.answer.strip()}
                                                for p in problems if INTEGER.fullmatch(p.answer.strip())])}
