"""The layout users meet (issue 53): a handful of recipes with an index, short docs pages that open with a verdict
or a how-to, one folder per study that opens with its question and verdict, and figures the overview pages quote
that the pages they point to hold."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted((ROOT / "docs").glob("*.md"))
STUDIES = sorted(p for p in (ROOT / "experiments").iterdir() if p.is_dir())


def test_recipes_are_few_and_each_is_in_the_index():
    recipes = sorted(p.name for p in (ROOT / "recipes").glob("*.yaml"))
    index = (ROOT / "recipes" / "README.md").read_text()
    assert len(recipes) <= 12 and "template.yaml" in recipes
    assert [r for r in recipes if f"]({r})" not in index] == []


def test_no_recipe_is_a_copy_for_one_more_seed():
    recipes = [p for p in [*(ROOT / "recipes").glob("*.yaml"), *(ROOT / "experiments").rglob("*.yaml")]]
    assert [p.name for p in recipes if re.search(r"-seed\d+\.yaml$", p.name)] == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_docs_pages_are_short_and_open_with_their_answer(page):
    lines = page.read_text().splitlines()
    assert len(lines) <= 300, f"{page.name}: {len(lines)} lines"
    first_screen = "\n".join(lines[:40])
    assert re.search(r"\*\*Verdict|^\| |^```|^## ", first_screen, re.M), f"{page.name}: no verdict, table or how-to on its first screen"


def test_readme_is_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 160


@pytest.mark.parametrize("page", ["two-skill.md", "routing.md"])
def test_the_verdict_tables_are_on_the_first_screen(page):
    head = "\n".join((ROOT / "docs" / page).read_text().splitlines()[:30])
    assert "**Verdict.**" in head and head.count("\n| ") >= 4


@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.name)
def test_each_study_opens_with_its_question_and_verdict(study):
    text = (study / "README.md").read_text()
    head = "\n".join(text.splitlines()[:30])
    assert head.startswith("# Study: ") and "**Question.**" in head and ("**Verdict" in head or "verdict" in head.lower())


def test_the_overview_pages_quote_only_figures_their_pages_hold():
    """README and docs/README name no more seeds or experts than the pages they point to (a figure quoted there must
    appear in a docs page)."""
    pages = " ".join(p.read_text() for p in PAGES if p.name != "README.md")
    for overview in (ROOT / "README.md", ROOT / "docs" / "README.md"):
        for figure in re.findall(r"\b(?:\d+|one|two|three|four|five) (?:seeds?|experts?)\b", overview.read_text()):
            assert figure in pages, f"{overview.name} quotes {figure!r}, which no docs page holds"
