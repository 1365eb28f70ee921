"""pipelines.yaml: schema validation, error messages, option merging, path resolution."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from prep.errors import UserError
from prep.pipelines import (
    FeaturesSection,
    TrainSection,
    get_pipeline,
    load_pipelines,
    stage_settings,
)

ROOT = Path(__file__).resolve().parents[1]

GOOD = """
pipelines:
  small:
    description: a test pipeline
    prep: {dataset: synthetic, out: data/small, num_images: 30}
    features: {kind: cnn, cnn: efficientnet_lite0, weights: none, crops: 1, out: feats/small.zarr}
    train: {family: chain, version: v1, p: 0.5, d: 64, epochs: 2, out: runs/small}
    evaluate: {protocols: [all]}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pipelines.yaml"
    path.write_text(text)
    return path


def test_project_pipelines_file_validates() -> None:
    pipes = load_pipelines(ROOT / "pipelines.yaml")
    assert {"demo", "coco-chain-resnet152", "f8k-fne-vse", "multi30k-liwe", "yj-liwe"} <= set(pipes)
    demo = pipes["demo"]
    assert demo.prep.dataset == "synthetic"
    assert demo.train is not None and demo.train.family == "chain"
    # downstream inputs default to upstream outputs
    assert demo.features is not None and demo.features.data == demo.prep.out
    assert demo.train.features == f"{demo.features.out}:global"


def test_paths_resolve_against_the_file_folder(tmp_path: Path) -> None:
    pipe = get_pipeline("small", write(tmp_path, GOOD))
    assert pipe.prep.out == str(tmp_path / "data" / "small")
    assert pipe.train is not None and pipe.train.data == str(tmp_path / "data" / "small")
    assert pipe.train.features == str(tmp_path / "feats" / "small.zarr") + ":global"


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (("num_images: 30", "num_images: 30, colour: red"), "pipeline 'small': prep.colour: unknown key"),
        (("epochs: 2", "epochs: many"), "pipeline 'small': train.epochs"),
        (("dataset: synthetic, ", ""), "pipeline 'small': prep.dataset: missing required key"),
        (("family: chain, version: v1", "family: oecc, version: v1"), "'version' applies to family chain"),
        (("kind: cnn", "kind: pixels"), "pipeline 'small': features.kind"),
    ],
)
def test_schema_errors_name_pipeline_and_key(tmp_path: Path, edit: tuple[str, str], expected: str) -> None:
    path = write(tmp_path, GOOD.replace(*edit))
    with pytest.raises(UserError) as err:
        load_pipelines(path)
    assert expected in str(err.value)
    assert str(path) in str(err.value)


def test_malformed_yaml_is_a_one_line_error(tmp_path: Path) -> None:
    path = write(tmp_path, "pipelines:\n  a: [unclosed\n")
    with pytest.raises(UserError, match="invalid YAML"):
        load_pipelines(path)


def test_unknown_pipeline_lists_known(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="known: small"):
        get_pipeline("nope", write(tmp_path, GOOD))


def test_environment_variables_only_needed_by_the_pipeline_run(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    text = GOOD + """
  needs-env:
    description: needs a variable
    prep: {dataset: coco, karpathy: "${VSE_TEST_ROOT}/dataset_coco.json", out: "${VSE_TEST_OUT:-out}/coco"}
"""
    path = write(tmp_path, text)
    monkeypatch.delenv("VSE_TEST_ROOT", raising=False)
    get_pipeline("small", path)  # another pipeline's missing variable is not an error
    with pytest.raises(UserError, match=r"VSE_TEST_ROOT"):
        get_pipeline("needs-env", path)
    monkeypatch.setenv("VSE_TEST_ROOT", "/data/coco")
    pipe = get_pipeline("needs-env", path)
    assert pipe.prep.karpathy == "/data/coco/dataset_coco.json"
    assert pipe.prep.out == str(tmp_path / "out" / "coco")


def _args(**kw: object) -> argparse.Namespace:
    return argparse.Namespace(**kw)


def test_explicit_options_override_pipeline_which_overrides_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    settings = stage_settings("train", _args(pipeline="small", pipelines=str(path), d=128, lr=None),
                              family="chain")
    assert isinstance(settings, TrainSection)
    assert settings.d == 128  # explicit
    assert settings.p == 0.5 and settings.epochs == 2  # pipeline
    assert settings.margin == 0.05 and settings.lr == 1e-3  # schema defaults


def test_stage_settings_without_pipeline_requires_the_required_keys() -> None:
    with pytest.raises(UserError, match="--out is required"):
        stage_settings("features", _args(pipeline=None, cnn="vgg16"), kind="cnn")
    s = stage_settings("features", _args(pipeline=None, cnn="vgg16", out="x.zarr"), kind="fne")
    assert isinstance(s, FeaturesSection) and s.kind == "fne" and s.threshold_low == -0.25


def test_subcommand_must_agree_with_pipeline(tmp_path: Path) -> None:
    path = write(tmp_path, GOOD)
    with pytest.raises(UserError, match="family 'chain', not 'oecc'"):
        stage_settings("train", _args(pipeline="small", pipelines=str(path)), family="oecc")


def test_wrong_option_type_on_command_line() -> None:
    with pytest.raises(UserError, match="train"):
        stage_settings("train", _args(pipeline=None, out="r", measure="euclid"), family="chain")
