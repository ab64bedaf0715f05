"""The command line as a user meets it: every argument described, --version, flags on either side of the
subcommand, the old world spellings, recipe variables (`--set`) and one-line errors naming what to fix."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from merging.cli import _walk, build_parser, main


def _arguments():
    for parser in _walk(build_parser()):
        for action in parser._actions:
            if not isinstance(action, argparse._SubParsersAction) and action.help is not argparse.SUPPRESS:
                yield parser.prog, action


def test_every_argument_of_every_command_has_help_and_shows_its_default():
    missing = [f"{prog} {'/'.join(a.option_strings) or a.dest}" for prog, a in _arguments() if not (a.help or "").strip()]
    assert missing == []
    walked = {prog for prog, _ in _arguments()}
    assert {"logitcomp run", "logitcomp world toy build", "logitcomp world smol train", "logitcomp bench decode",
            "logitcomp pool-seeds", "logitcomp routing-report"} <= walked
    help_text = next(p for p in _walk(build_parser()) if p.prog == "logitcomp generate").format_help()
    assert "--max-new-tokens MAX_NEW_TOKENS" in help_text and "(default: 32)" in help_text


def test_version_and_global_flags_before_or_after_the_subcommand(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0 and capsys.readouterr().out.startswith("logitcomp ")
    for argv in (["--debug", "-v", "validate", "x.yaml"], ["validate", "x.yaml", "--debug", "-v"], ["validate", "--debug", "x.yaml", "-v"]):
        args = build_parser().parse_args(argv)
        assert args.debug and args.verbose and args.recipe == "x.yaml", argv
    args = build_parser().parse_args(["validate", "x.yaml"])
    assert not args.debug and not args.verbose


def test_world_commands_are_grouped_and_the_old_spelling_still_works():
    proc = subprocess.run([sys.executable, "-m", "merging.cli", "toy", "build", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("usage: logitcomp world toy build")
    top = build_parser().format_help()
    assert "world" in top and "\n    toy" not in top  # the world builders sit under `world`, not beside `run`


@pytest.mark.parametrize("argv, message", [
    (["--set", "sed=1"], r"--set: 'sed' is not a variable of the recipe \(did you mean 'seed'\?\); its vars: seed"),
    (["--set", "seed"], r"--set: expected NAME=VALUE"),
])
def test_set_refuses_what_the_recipe_does_not_declare(tmp_path, capsys, argv, message):
    import re

    recipe = tmp_path / "r.yaml"
    recipe.write_text("vars: {seed: 0}\nname: r${seed}\nbase: b\nexperts: {a: a}\nevaluate: {tasks: [t]}\noutput: out\n")
    assert main(["validate", str(recipe), *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and re.search(message, err), err
