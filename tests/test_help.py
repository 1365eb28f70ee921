"""Every subcommand's help: a description, the common options, no ``(default: None)`` noise."""

from __future__ import annotations

import argparse

import pytest

from features.cli import build_parser as features_parser
from prep.cli import build_parser as prep_parser
from train.cli import build_parser as train_parser


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[argparse.ArgumentParser, str]]:
    """name -> (its parser, its one-line help in the parent's list)."""
    action, = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {a.dest: a.help or "" for a in action._choices_actions}
    return {name: (sub, helps.get(name, "")) for name, sub in action.choices.items()}


@pytest.mark.parametrize("build", [prep_parser, features_parser, train_parser],
                         ids=["prep", "features", "train"])
def test_every_subcommand_has_a_description_and_the_common_options(build) -> None:
    subs = _subcommands(build())
    assert len(subs) >= 3
    for name, (sub, line) in subs.items():
        text = sub.format_help()
        assert "(default: None)" not in text, name
        for option in ("--traceback", "-q, --quiet", "-v, --verbose"):
            assert option in text, (name, option)
        assert line, f"{name}: no help line in the command list"
        if "not implemented yet" in line:  # a placeholder command says so instead
            continue
        assert sub.description and len(sub.description) > 20, f"{name}: no description"
