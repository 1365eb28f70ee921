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


FAMILIES = ("chain", "oecc", "seam", "vse", "clmr", "liwe")


def _help_defaults(family: str) -> dict[str, str]:
    """option dest -> the text of its "(default X)" note in ``train <family> --help``."""
    import re

    sub, _ = _subcommands(train_parser())[family]
    out = {}
    for action in sub._actions:
        match = re.search(r"\(default ([^;()]*)[;)]", action.help or "")
        if match and not (action.help or "").startswith("the FNE paper's pipeline"):
            out[action.dest] = match.group(1)
    return out


@pytest.mark.parametrize("family", FAMILIES)
def test_help_shows_each_familys_own_defaults(family: str) -> None:
    """Every setting's "(default X)" is what the family resolves (schema defaults, then its own: vse's
    cosine, margin 0.2, lr 2e-4, 200 epochs; clmr/liwe's cosine), i.e. what a run records."""
    from train.cli.fit_options import NOT_SETTINGS, resolved_defaults
    from vsecore.options import shown as as_help

    shown = _help_defaults(family)
    resolved = resolved_defaults(family)
    settings = [k for k in shown if k in type(resolved).model_fields and k not in NOT_SETTINGS]
    assert {"measure", "margin", "lr", "epochs", "batch_size", "d"} <= set(settings), family
    for key in settings:
        assert shown[key] == as_help(getattr(resolved, key)), (family, key, shown[key])
    expected = {"vse": ("cosine", "0.2", "0.0002", "200"), "clmr": ("cosine", "0.2", "0.001", "30"),
                "chain": ("order", "0.05", "0.001", "30")}.get(family)
    if expected:
        assert (shown["measure"], shown["margin"], shown["lr"], shown["epochs"]) == expected


def test_a_run_records_the_defaults_its_help_shows(tmp_path: Path) -> None:
    """A real run of each of two families: every setting not given on the command line is in its
    config.json with the value ``--help`` shows."""
    import json

    from helpers import make_prepared, make_store

    prepared = make_prepared(tmp_path / "data", n_train=12, n_val=4, n_test=4)
    store = make_store(tmp_path / "f.zarr", prepared)
    given = {"data", "features", "out", "d", "word_dim", "epochs", "batch_size", "device", "p"}
    for family, extra in (("chain", ["--p", "0.125"]), ("vse", ["--word-dim", "16"])):
        out = tmp_path / family
        assert train_main([family, "--data", str(prepared), "--features", f"{store}:global", "--out",
                           str(out), "--d", "16", "--epochs", "1", "--batch-size", "4", "--device", "cpu",
                           "-q", *extra]) == 0
        recorded = json.loads((out / "config.json").read_text())["settings"]
        from vsecore.options import shown

        for key, text in _help_defaults(family).items():
            if key in recorded and key not in given and recorded[key] is not None:
                assert shown(recorded[key]) == text, (family, key, recorded[key], text)


@pytest.mark.parametrize("family", FAMILIES)
def test_help_keeps_every_description_but_its_default_note(family: str) -> None:
    """``--help`` replaces only a setting's own "(default ...)" note, with the resolved value: the rest of
    its description is shown, and a note that explains more than the value (``(default 1: every train
    word)``) would lose that text, so such a note is kept only where no value resolves without data, or
    where the family's ``help_notes`` add that text to the value."""
    import re

    from train.cli.fit_options import NOT_SETTINGS, resolved_defaults
    from train.models.family import get_family
    from vsecore.options import DEFAULT_NOTE as _DEFAULT_NOTE

    sub, _ = _subcommands(train_parser())[family]
    resolved = resolved_defaults(family)
    fields = type(resolved).model_fields
    for action in sub._actions:
        key = action.dest
        if key not in fields or key in NOT_SETTINGS:
            continue
        description = (fields[key].description or "").replace("%", "%%")
        note = _DEFAULT_NOTE.search(description)
        kept = description[:note.start()] if note else description
        assert (action.help or "").startswith(kept), (family, key, action.help)
        if note and getattr(resolved, key) is not None and key not in get_family(family).help_notes:
            explained = note.group(0).strip().removeprefix("(default").lstrip(":")
            assert not re.search(r"[:;]", explained), (family, key, note.group(0))
