"""pipelines.yaml: schema validation, error messages, option merging, path resolution."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from features.settings import FeaturesSection, features_section, features_settings_class
from pipelines.schema import get_pipeline, load_pipelines
from prep.dataset import PreparedDataset
from train.config.sections import train_section
from train.engine.settings import TrainSection
from train.models.family import settings_class
from vsecore.errors import UserError
from vsecore.pipelines_file import pipeline_settings, settings_from

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


def stage_settings(stage: str, args: argparse.Namespace, **fixed: str):
    """A stage command's settings as ``train <family>`` and ``features <kind>`` build them: its ``--pipeline``
    section read by the stage's own reader, merged under the explicit options."""
    if stage == "train":
        return settings_from(settings_class(fixed["family"]), stage, args, fixed,
                             pipeline_settings(args, stage, train_section))
    return settings_from(features_settings_class(), stage, args, fixed,
                         pipeline_settings(args, stage, features_section))


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
    with pytest.raises(UserError, match="^--measure 'euclid': must be 'order' or 'cosine'$"):
        stage_settings("train", _args(pipeline=None, out="r", measure="euclid"), family="chain")


def test_empty_variables_behave_as_in_the_shell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    text = GOOD + """
  needs-env:
    description: needs a variable
    prep: {dataset: coco, karpathy: "${VSE_TEST_ROOT}/dataset_coco.json", out: "${VSE_TEST_OUT:-out}/coco"}
"""
    path = write(tmp_path, text)
    monkeypatch.setenv("VSE_TEST_ROOT", "/data/coco")
    monkeypatch.setenv("VSE_TEST_OUT", "")  # ${VAR:-default}: the default, as for an unset variable
    assert get_pipeline("needs-env", path).prep.out == str(tmp_path / "out" / "coco")
    monkeypatch.setenv("VSE_TEST_ROOT", "")  # ${VAR} empty: an error naming it, for the pipeline run only
    get_pipeline("small", path)
    with pytest.raises(UserError) as err:
        get_pipeline("needs-env", path)
    assert ("pipeline 'needs-env': prep.karpathy: environment variable ${VSE_TEST_ROOT} is empty"
            in str(err.value))


# -- the runner: inputs in the prep fingerprint, no silent replacement of trained work ----------------

RUNNER = """
pipelines:
  p:
    description: a pipeline whose features and training are recorded, not run
    prep: {dataset: coco, karpathy: karpathy.json, images: images, out: data}
    features: {kind: cnn, cnn: efficientnet_lite0, weights: none, crops: 1, out: feats.zarr}
    train: {family: chain, d: 8, epochs: 1, out: run}
"""


@pytest.fixture
def recorded_runner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, bool, bool]]:
    """Real prep; features and train replaced by recorders that write a store / a run directory."""
    from pipelines import runner as pipeline

    calls: list[tuple[str, bool, bool]] = []

    def features(pipe, resume: bool, overwrite: bool) -> None:
        calls.append(("features", resume, overwrite))
        store = Path(pipe.features.out)
        made_with = json.loads((store / "crops").read_text()) if store.exists() else pipe.features.crops
        if made_with != pipe.features.crops and not overwrite:  # as FeatureStore.open_or_create does
            raise UserError(f"{store}: the existing store was made with other crops")
        store.mkdir(exist_ok=True)
        (store / "crops").write_text(str(pipe.features.crops))

    def train(pipe, resume: bool, overwrite: bool) -> None:
        calls.append(("train", resume, overwrite))
        Path(pipe.train.out).mkdir(exist_ok=True)
        (Path(pipe.train.out) / "config.json").write_text("{}")

    monkeypatch.setitem(pipeline.RUNNERS, "features", features)
    monkeypatch.setitem(pipeline.RUNNERS, "train", train)
    (tmp_path / "images").mkdir()
    rows = [{"filename": f"{k}.jpg", "cocoid": k, "split": sp,
             "sentences": [{"raw": f"a dog {k}", "sentid": k}]}
            for k, sp in enumerate(("train", "val", "test"))]
    (tmp_path / "karpathy.json").write_text(json.dumps({"images": rows}))
    write(tmp_path, RUNNER)
    return calls


def _pipeline(tmp_path: Path, capsys: pytest.CaptureFixture, *options: str) -> tuple[int, str, str]:
    from train.cli import main as train_main

    code = train_main(["pipeline", "p", "--pipelines", str(tmp_path / "pipelines.yaml"), *options])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_an_edited_input_reruns_prep_and_everything_after_it(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                             recorded_runner: list) -> None:
    code, out, _ = _pipeline(tmp_path, capsys)
    assert code == 0 and recorded_runner == [("features", False, False), ("train", False, False)]
    assert _pipeline(tmp_path, capsys)[1].count("up to date") == 3
    # same size, other content: the checksum, not the size, tells
    karpathy = tmp_path / "karpathy.json"
    karpathy.write_text(karpathy.read_text().replace("a dog 1", "a cat 1"))
    code, out, err = _pipeline(tmp_path, capsys)
    assert f"prep: running -> {tmp_path / 'data'} (input changed: {karpathy} (content changed))" in out
    assert "features: running" in out and recorded_runner[-1] == ("features", False, False)
    # training has a run there already: refused, never replaced without --overwrite
    assert code == 2 and err.count("\n") == 1
    assert (f"{tmp_path / 'run'}: the run directory of pipeline 'p' already holds a run that was made with "
            "other settings") in err
    assert "set train.out to a new run folder, or run `train pipeline p --overwrite`" in err
    assert any(s.raw == "a cat 1" for s in PreparedDataset.load(tmp_path / "data").sentences)
    code, out, _ = _pipeline(tmp_path, capsys, "--overwrite")
    assert code == 0 and "prep: up to date" in out and "features: up to date" in out
    assert recorded_runner[-1] == ("train", False, True)
    assert _pipeline(tmp_path, capsys)[1].count("up to date") == 3


def test_force_replaces_nothing_expensive_without_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                            recorded_runner: list) -> None:
    assert _pipeline(tmp_path, capsys)[0] == 0
    code, out, err = _pipeline(tmp_path, capsys, "--force")
    assert "prep: running" in out and recorded_runner[-1] == ("features", False, False)
    assert code == 2 and "this pipeline's finished run, which --force replaces only with --overwrite" in err
    assert _pipeline(tmp_path, capsys, "--force", "--overwrite")[0] == 0
    assert recorded_runner[-2:] == [("features", False, True), ("train", False, True)]


def test_a_changed_training_setting_refuses_to_replace_the_run(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                               recorded_runner: list) -> None:
    assert _pipeline(tmp_path, capsys)[0] == 0
    write(tmp_path, RUNNER.replace("epochs: 1", "epochs: 2"))
    code, out, err = _pipeline(tmp_path, capsys)
    assert code == 2 and "already holds a run" in err and out.count("up to date") == 2
    write(tmp_path, RUNNER.replace("epochs: 1, out: run", "epochs: 2, out: run2"))
    assert _pipeline(tmp_path, capsys)[0] == 0 and (tmp_path / "run2" / "config.json").is_file()


def test_a_refused_stage_keeps_its_state_so_overwrite_applies_next(
        tmp_path: Path, capsys: pytest.CaptureFixture, recorded_runner: list) -> None:
    assert _pipeline(tmp_path, capsys)[0] == 0
    state = (tmp_path / "feats.zarr.stage.json").read_text()
    write(tmp_path, RUNNER.replace("crops: 1", "crops: 10"))
    code, _, err = _pipeline(tmp_path, capsys)
    assert code == 2 and "existing store was made with other crops" in err
    assert (tmp_path / "feats.zarr.stage.json").read_text() == state  # not "running": nothing to resume
    code, out, _ = _pipeline(tmp_path, capsys, "--overwrite")
    assert code == 0 and recorded_runner[-2:] == [("features", False, True), ("train", False, True)]


# -- issue 43.2: a missing path that came from a variable names it -------------------------------------------

FROM_VARIABLE = """
pipelines:
  sample:
    description: paths from a variable
    prep:
      dataset: coco
      flat: ["${VSE_TEST_SHARED:-nowhere}/coco_sample/train.json",
             "${VSE_TEST_SHARED:-nowhere}/coco_sample/val.json"]
      out: data
"""


def test_a_missing_file_from_a_variable_names_the_variable_and_the_pipeline(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    from prep.cli import main as prep_main
    from train.cli import main as train_main

    path = write(tmp_path, FROM_VARIABLE)
    monkeypatch.delenv("VSE_TEST_SHARED", raising=False)
    missing = tmp_path / "nowhere" / "coco_sample" / "train.json"
    expected = (f"{missing}: no such file (given by --flat, from ${{VSE_TEST_SHARED:-nowhere}} in pipeline "
                "'sample': set VSE_TEST_SHARED to the folder holding coco_sample/train.json)")
    for main, argv in ((train_main, ["pipeline", "sample", "--pipelines", str(path), "--until", "prep"]),
                       (prep_main, ["coco", "--pipeline", "sample", "--pipelines", str(path)])):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].endswith(expected), err
    monkeypatch.setenv("VSE_TEST_SHARED", str(tmp_path / "elsewhere"))  # set, and still wrong: says so
    assert train_main(["pipeline", "sample", "--pipelines", str(path), "--until", "prep"]) == 2
    assert (f"from ${{VSE_TEST_SHARED:-nowhere}} in pipeline 'sample': set VSE_TEST_SHARED to the folder "
            f"holding coco_sample/train.json (now {tmp_path / 'elsewhere'}))") in capsys.readouterr().err
    # a path written without a variable is the stage's message as it was
    write(tmp_path, FROM_VARIABLE.replace("${VSE_TEST_SHARED:-nowhere}", "nowhere"))
    assert train_main(["pipeline", "sample", "--pipelines", str(path), "--until", "prep"]) == 2
    assert capsys.readouterr().err.strip().endswith(f"{missing}: no such file (given by --flat)")


def test_the_project_pipelines_name_vse_shared_data(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``train pipeline coco-sample-chain --until prep`` without the shared data says which variable to
    set."""
    from train.cli import main as train_main

    for name in ("VSE_WORK", "VSE_RUNS"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("VSE_SHARED_DATA", str(tmp_path / "no-shared-data"))
    assert train_main(["pipeline", "coco-sample-chain", "--pipelines", str(ROOT / "pipelines.yaml"),
                       "--until", "prep"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith("(given by --flat, from ${VSE_SHARED_DATA:-../shared/data} in pipeline "
                        "'coco-sample-chain': set VSE_SHARED_DATA to the folder holding "
                        f"coco_sample/train.json (now {tmp_path / 'no-shared-data'}))"), err
