"""Bad configs through ``python -m engine run``: exit 2, one line on stderr, and no table gains or loses a row."""
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.cli import main
from storage import get_engine, init_db, session_scope
from support.bad_configs import BASE, _counts, _toml, _with









MISSING = "/nonexistent/compatlab-data"
CASES = {  # id -> (config dict, extra argv)
    "top-level typo": ({**BASE, "epochs": 3}, []),
    "section not a table": ({**BASE, "training": 3}, []),
    "name empty": (_with(name="  "), []),
    "name not text": (_with(name=3), []),
    "methods empty": (_with(methods=[]), []),
    "methods not a list": (_with(methods="bct"), []),
    "unknown method": (_with(methods=["nope"]), []),
    "method twice": (_with(methods=["bct", "bct"]), []),
    "params for an absent method": (_with(method_params={"cores": {}}), []),
    "unknown hyper-parameter": (_with(methods=["bct"], method_params={"bct": {"lambda": 1.0}}), []),
    "hyper-parameter for a method without any": (_with(method_params={"independent": {"lam": 1.0}}), []),
    "negative hyper-parameter": (_with(methods=["bct"], method_params={"bct": {"lam": -1.0}}), []),
    "hyper-parameter not a table": (_with(methods=["bct"], method_params={"bct": 3}), []),
    "seed negative": (_with(seed=-1), []),
    "seed float": (_with(seed=1.5), []),
    "device unknown": (_with(device="gpu"), []),
    "dataset unknown": (_with(dataset__name="mnist"), []),
    "dataset root empty": (_with(dataset__root=""), []),
    "cifar root missing": (_with(dataset__name="cifar10", dataset__root=MISSING), []),
    "imagefolder root missing": (_with(dataset__name="imagefolder", dataset__root=MISSING), []),
    "num_classes zero": (_with(dataset__name="shapes", dataset__num_classes=0), []),
    "train_per_class zero": (_with(dataset__train_per_class=0), []),
    "test_per_class negative": (_with(dataset__test_per_class=-5), []),
    "image_size huge": (_with(dataset__image_size=100000), []),
    "augment not bool": (_with(dataset__augment="yes"), []),
    "protocol unknown": (_with(eval__protocol="closedset"), []),
    "gallery typo": (_with(eval__gallery="templat"), []),
    "eval_classes unknown": (_with(eval__eval_classes="some"), []),
    "seen with open-set": (_with(eval__protocol="open-set", eval__eval_classes="seen"), []),
    "open-set without held-out data": (_with(eval__protocol="open-set"), []),
    "open-set dataset missing": (_with(eval__protocol="open-set", eval__open_set_dataset="cifar10", dataset__root=MISSING), []),
    "open-set dataset itself": (_with(eval__protocol="open-set", eval__open_set_dataset="digits"), []),
    "open-set dataset unknown": (_with(eval__protocol="open-set", eval__open_set_dataset="mnist"), []),
    "open_set_classes zero": (_with(dataset__name="shapes", eval__protocol="open-set", eval__open_set_classes=0), []),
    "metric unknown": (_with(eval__metrics=["precision"]), []),
    "metric recall@0": (_with(eval__metrics=["recall@0"]), []),
    "metrics empty": (_with(eval__metrics=[]), []),
    "topk zero": (_with(eval__topk=0), []),
    "topk above the first model's classes": (_with(eval__topk=64), []),
    "view unknown": (_with(eval__views=["pixels"]), []),
    "auto with other views": (_with(eval__views=["auto", "psp"]), []),
    "initial_classes zero": (_with(scenario__initial_classes=0), []),
    "increment negative": (_with(scenario__increment=-5), []),
    "classes do not divide": (_with(scenario__initial_classes=4, scenario__increment=4, scenario__num_steps=None), []),
    "num_steps does not fit": (_with(scenario__num_steps=3), []),
    "more initial classes than the dataset": (_with(scenario__initial_classes=20, scenario__num_steps=1), []),
    "training mode unknown": (_with(scenario__training="incremental"), []),
    "replay negative": (_with(scenario__training="finetune", scenario__replay_per_class=-1), []),
    "replay with cumulative": (_with(scenario__replay_per_class=5), []),
    "replacement at step 1": (_with(scenario__replacement_steps=[1]), []),
    "replacement past the end": (_with(scenario__replacement_steps=[7]), []),
    "backbone unknown": (_with(model__backbone="resnet999"), []),
    "width zero": (_with(model__width=0), []),
    "width on a fixed backbone": (_with(model__backbone="resnet18_cifar", model__width=8), []),
    "3-channel backbone on 1-channel digits": (_with(model__backbone="resnet18", model__width=None), []),
    "dsimplex_classes below the classes": (_with(methods=["dsimplex_hoc"], model__dsimplex_classes=5), []),
    "init_seed unknown": (_with(model__init_seed="random"), []),
    "epochs negative": (_with(training__epochs=-1), []),
    "epochs zero": (_with(training__epochs=0), []),
    "batch_size zero": (_with(training__batch_size=0), []),
    "batch_size negative": (_with(training__batch_size=-3), []),
    "batch_size huge": (_with(training__batch_size=100000), []),
    "optimizer unknown": (_with(training__optimizer="adamw"), []),
    "schedule typo": (_with(training__lr_schedule="cosinee"), []),
    "lr zero": (_with(training__lr=0.0), []),
    "lr nan": (_with(training__lr=float("nan")), []),
    "lr inf": (_with(training__lr=float("inf")), []),
    "lr text": (_with(training__lr="fast"), []),
    "momentum one": (_with(training__momentum=1.0), []),
    "weight_decay negative": (_with(training__weight_decay=-0.1), []),
    "milestones not increasing": (_with(training__lr_schedule="step", training__lr_milestones=[5, 2]), []),
    "lr_gamma zero": (_with(training__lr_gamma=0.0), []),
    "num_workers negative": (_with(training__num_workers=-1), []),
    "override epochs -1": (BASE, ["--epochs", "-1"]),
    "override device": (BASE, ["--device", "tpu"]),
    "override methods": (BASE, ["--methods", "nope"]),
}




@pytest.fixture(scope="module")
def db_url(tmp_path_factory):
    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'bad.db'}"
    init_db(get_engine(url))
    return url


@pytest.mark.parametrize("case", list(CASES))
def test_bad_config_is_refused_in_one_line_and_writes_nothing(case, db_url, tmp_path, capsys):
    if case == "override device" and torch.cuda.is_available():
        pytest.skip("the device check cannot fail where CUDA is present")
    data, extra = CASES[case]
    path = tmp_path / "c.toml"
    path.write_text(_toml(data))
    db = get_engine(db_url)
    before = _counts(db)
    code = main(["run", str(path), "--db", db_url, "--quiet", "--checkpoints", str(tmp_path / "ck"), *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert _counts(db) == before
    assert not (tmp_path / "ck").exists()


def test_the_base_config_is_valid(tmp_path):
    from engine.core.config import config_from_dict
    from engine.run.pipeline import check_study

    path = tmp_path / "c.toml"
    path.write_text(_toml(BASE))
    import tomllib

    assert check_study(config_from_dict(tomllib.loads(path.read_text()))).total_classes == 10


@pytest.mark.parametrize("argv", [["compare", "missing.toml"]])  # one: each subprocess imports torch
def test_bad_runs_through_a_subprocess(argv, db_url):
    proc = subprocess.run([sys.executable, "-m", "engine", *argv, "--db", db_url], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stdout == ""


@pytest.mark.parametrize("case", ["classes do not divide", "cifar root missing", "negative hyper-parameter"])
def test_the_worker_refuses_an_infeasible_run_job_before_any_study_row(case, tmp_path):
    from engine.jobs.worker import run_one
    from storage import enqueue_job, list_jobs

    db = get_engine(f"sqlite:///{tmp_path / 'w.db'}")
    init_db(db)
    with session_scope(db) as s:
        enqueue_job(s, "run", {"config": CASES[case][0]})
    before = {k: v for k, v in _counts(db).items() if k != "jobs"}
    run_one(db, checkpoint_dir=tmp_path / "ck")
    with session_scope(db) as s:
        job = list_jobs(s, limit=1)[0]
        assert job.status == "failed" and re.match(r"\w+Error: \S", job.error), job.error  # first line; a traceback follows
    assert {k: v for k, v in _counts(db).items() if k != "jobs"} == before
