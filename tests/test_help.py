"""Every subcommand's help: a description, the common options, no ``(default: None)`` noise; one
meaning of ``--device`` everywhere, and a bad one is a one-line error."""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pytest

from features.cli import build_parser as features_parser
from features.cli import main as features_main
from prep.cli import build_parser as prep_parser
from prep.cli import main as prep_main
from train.cli import build_parser as train_parser
from train.cli import main as train_main
from vsecore.device import DEVICE_HELP


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


def test_device_has_one_meaning_and_a_bad_one_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    for build in (features_parser, train_parser):
        for name, (sub, _) in _subcommands(build()).items():
            devices = [a for a in sub._actions if "--device" in a.option_strings]
            assert all(a.help == DEVICE_HELP for a in devices), name
    assert prep_main(["synthetic", "--num-images", "30", "--languages", "en", "--out", str(tmp_path / "d"),
                      "-q"]) == 0
    np.save(tmp_path / "i.npy", np.eye(4, dtype=np.float32))
    capsys.readouterr()
    for main, args in (
            (features_main, ["cnn", "--data", str(tmp_path / "d"), "--cnn", "efficientnet_lite0", "--weights",
                             "none", "--out", str(tmp_path / "s.zarr")]),
            (train_main, ["chain", "--data", str(tmp_path / "d"), "--features", str(tmp_path / "s.zarr"),
                          "--out", str(tmp_path / "run")]),
            (train_main, ["evaluate", "--img-emb", str(tmp_path / "i.npy"), "--cap-emb",
                          str(tmp_path / "i.npy"), "--captions-per-image", "1", "--measure", "cosine"])):
        assert main([*args, "--device", "gpu"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.endswith("--device gpu: not a device (auto, cpu, cuda or cuda:N)"), err
        assert len(err.splitlines()) == 1
    assert not (tmp_path / "s.zarr").exists() and not (tmp_path / "run").exists()
