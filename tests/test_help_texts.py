"""Issue 43.8 and 42.4: what ``--help`` says of the shared options (each command's own words for ``--run`` and
``--overwrite``, ``--device`` in compare's usage, defaults from the settings), and a model folder made for
publishing written with one file mode."""

from __future__ import annotations

import argparse
import os
import stat
from pathlib import Path

import pytest

from features.cli import build_parser as features_parser
from prep.cli import build_parser as prep_parser
from prep.settings import PrepSection
from train.cli import build_parser as train_parser
from train.cli import main as train_main
from vsecore.options import field_defaults, shown


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action, = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def _help(sub: argparse.ArgumentParser, option: str) -> str:
    found = [a.help or "" for a in sub._actions if option in a.option_strings]
    return found[0] if found else ""


def test_each_run_option_says_which_runs_its_command_reads() -> None:
    subs = _subcommands(train_parser())
    runs = {name: _help(subs[name], "--run") for name in ("evaluate", "query", "export-embeddings",
                                                          "export-model", "convert-checkpoints", "predict")}
    assert "export-model" not in runs["export-model"] and "train <family>" in runs["export-model"]
    assert "train classify" in runs["predict"] and "train <family>" not in runs["predict"]
    for name in ("evaluate", "query", "export-embeddings"):  # they open a model folder as a run
        assert "model folder written by `train export-model`" in runs[name], name
    assert "train classify" in runs["evaluate"] and "train classify" in runs["convert-checkpoints"]


def test_compare_lists_device_in_its_usage_and_help() -> None:
    compare = _subcommands(train_parser())["compare"]
    assert "[--device DEVICE]" in compare.format_usage()
    assert "--device" in compare.description
    assert "(default 0.05:0.25:0.05)" in _help(compare, "--noise")  # the settings' default, not restated


@pytest.mark.parametrize("build", [prep_parser, features_parser, train_parser],
                         ids=["prep", "features", "train"])
def test_every_overwrite_says_what_it_replaces(build) -> None:
    """``--overwrite`` is declared once (``vsecore.options.add_overwrite_option``), each command giving its
    own words for what it replaces."""
    texts = {name: _help(sub, "--overwrite") for name, sub in _subcommands(build()).items()}
    said = {name: text for name, text in texts.items() if text}
    assert said, texts
    for name, text in said.items():
        assert len(text) > 20 and any(w in text for w in ("replace", "start", "delete")), (name, text)


def test_prep_help_shows_the_settings_defaults() -> None:
    """Every default ``prep --help`` shows is :class:`prep.settings.PrepSection`'s."""
    subs = _subcommands(prep_parser())
    defaults = field_defaults(PrepSection)
    checked = 0
    for sub in subs.values():
        for action in sub._actions:
            if action.dest in defaults and "(default " in (action.help or "") and action.dest != "name":
                words = action.nargs not in (None, "?")
                value = shown(defaults[action.dest], " " if words else ",")
                assert action.help.endswith(f"(default {value})"), (action.dest, action.help)
                checked += 1
    assert checked > 20
    assert "(default en de ja)" in _help(subs["synthetic"], "--languages")
    assert "(default 100)" in _help(subs["coco"], "--flat-val-images")


def test_an_exported_model_folder_has_one_file_mode(tiny_chain_run: Path, tmp_path: Path) -> None:
    """``weights.safetensors`` was written 0600 beside a 0644 ``model.json``: both are 0666 less the umask
    now, as every file vsecore.io writes."""
    out = tmp_path / "model"
    before = os.umask(0o022)
    try:
        assert train_main(["export-model", "--run", str(tiny_chain_run), "--out", str(out), "-q"]) == 0
    finally:
        os.umask(before)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert modes == {"model.json": 0o644, "weights.safetensors": 0o644}, modes
