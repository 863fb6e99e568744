"""Issue 12's file attacks: paths outside the data roots, TorchScript that reads or writes files, a CIFAR
pickle that runs a command, a zip that inflates, and the upload limit the page shows vs the one enforced."""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

import run_app
from engine.data import roots
from engine.checkpoints.files import CheckpointError, Trust
from engine.checkpoints.loading import load_model
from engine.checkpoints.sandbox_child import landlock_abi
from engine.data.disk import load_cifar, load_imagefolder
from engine.jobs import job_handlers
from engine.jobs.worker import run_one
from storage import enqueue_job, get_engine, init_db, list_jobs, session_scope

ROOT = Path(__file__).resolve().parents[1]
SECRET = "TOPSECRET-4f1d-passwords"


# --- data roots ------------------------------------------------------------------------------


@pytest.fixture
def outside(tmp_path_factory) -> Path:
    """A folder outside every data root, holding a class sub-folder whose name must never be shown."""
    folder = tmp_path_factory.mktemp("outside")
    (folder / "private_class_name").mkdir()
    (folder / "private_class_name" / "a.png").write_bytes(b"not read")
    return folder


def test_paths_outside_the_roots_are_refused_without_listing(tmp_path, outside):
    (tmp_path / "link").symlink_to(outside)
    inside = tmp_path / "imgs"
    inside.mkdir()
    assert roots.confine(inside) == inside.resolve()
    for given in (outside, tmp_path / "link", inside / ".." / ".." / outside.name, "/"):
        with pytest.raises(roots.OutsideRootsError) as caught:
            load_imagefolder(given)
        message = str(caught.value)
        assert "outside the data roots" in message and "\n" not in message
        assert "private_class_name" not in message and "etc" not in message.split("(")[-1]


def test_data_root_flag_widens_the_roots(outside, monkeypatch):
    with pytest.raises(roots.OutsideRootsError):
        roots.confine(outside)
    monkeypatch.setenv(roots.ROOTS_ENV, os.environ[roots.ROOTS_ENV])  # restored after the test
    roots.export(run_app.parse_args(["--data-root", str(outside)]))
    assert roots.confine(outside / "private_class_name") == (outside / "private_class_name").resolve()


def test_imagefolder_errors_do_not_list_the_folders(tmp_path):
    (tmp_path / "imgs" / "hidden_cls").mkdir(parents=True)
    with pytest.raises(ValueError) as caught:
        load_imagefolder(tmp_path / "imgs")
    assert "has no usable images" in str(caught.value) and "hidden_cls" not in str(caught.value)


# --- CIFAR without running code --------------------------------------------------------------


class _System:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


def test_planted_cifar_pickle_runs_nothing(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    marker = tmp_path / "ran"
    payload = pickle.dumps({"data": _System(f"touch {marker}"), "labels": [0]}, protocol=2)
    pickle.loads(payload)  # the payload is live: plain pickle runs the command
    assert marker.exists()
    marker.unlink()
    for name in [*(f"data_batch_{i}" for i in range(1, 6)), "test_batch", "batches.meta"]:
        (folder / name).write_bytes(payload)
    with pytest.raises(ValueError) as caught:
        load_cifar("cifar10", root=tmp_path)
    assert "would call posix.system" in str(caught.value) and "\n" not in str(caught.value)
    assert not marker.exists()


# --- TorchScript: refused by default, scanned, contained -------------------------------------


class Reader(nn.Module):
    """forward returns the bytes of a file as its logits (torch.from_file, shared=False)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path, self.size = path, len(SECRET)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.from_file(self.path, shared=False, size=self.size, dtype=torch.uint8)
        return s.float().view(1, -1).expand(x.shape[0], self.size) + x.flatten(1)[:, :1]


class Writer(nn.Module):
    """forward maps a file shared and overwrites it (creates it when missing)."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self.path = path

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.from_file(self.path, shared=True, size=16, dtype=torch.uint8)
        s.fill_(65)
        return x.flatten(1)[:, :4] + s[:4].float()


@pytest.fixture(scope="module")
def archives(tmp_path_factory) -> dict[str, Path]:
    """The attack archives, scripted once (TorchScript compiles a class once per process)."""
    folder = tmp_path_factory.mktemp("attack")
    files = {"secret": folder / "secret.txt", "target": folder / "target.txt", "created": folder / "created.txt"}
    for name, module in (("reader", Reader(str(files["secret"]))), ("writer", Writer(str(files["target"]))),
                         ("creator", Writer(str(files["created"])))):
        files[name] = folder / f"{name}.pt"
        torch.jit.save(torch.jit.script(module), str(files[name]))
    return files


@pytest.fixture
def attack(archives, monkeypatch) -> dict[str, Path]:
    """A planted secret, an existing target and a file that must not appear; the archives' folder is a data root."""
    archives["secret"].write_text(SECRET + "\n")
    archives["target"].write_text("original target content\n")
    archives["created"].unlink(missing_ok=True)
    monkeypatch.setenv(roots.ROOTS_ENV, os.pathsep.join([os.environ[roots.ROOTS_ENV], str(archives["secret"].parent)]))
    return archives


def _run_job(url: str, model: Path) -> dict:
    db = get_engine(url)
    init_db(db)
    with session_scope(db) as s:
        enqueue_job(s, "checkpoints", {"spec": {"models": [{"path": str(model)}], "dataset": "digits",
                                                "views": ["encoder"]}})
    run_one(db)
    with session_scope(db) as s:
        job = list_jobs(s)[0]
        return {"status": job.status, "error": job.error or "", "message": job.message or ""}


def _nowhere(url: str, job: dict, attack: dict[str, Path]) -> None:
    assert job["status"] == "failed"
    assert SECRET not in json.dumps(job)
    database = Path(url.removeprefix("sqlite:///"))
    for path in database.parent.glob(database.name + "*"):
        assert SECRET.encode() not in path.read_bytes()
    assert attack["target"].read_text() == "original target content\n"
    assert not attack["created"].exists()


@pytest.mark.parametrize("name", ["reader", "writer", "creator"])
def test_worker_refuses_torchscript_by_default(db_url, attack, name, monkeypatch):
    monkeypatch.delenv(roots.TORCHSCRIPT_ENV, raising=False)
    job = _run_job(db_url, attack[name])
    assert "a program, not weights" in job["message"] and "--allow-torchscript" in job["message"]
    _nowhere(db_url, job, attack)


@pytest.mark.parametrize("name", ["reader", "writer"])
def test_allowed_torchscript_that_touches_files_is_refused_by_the_scan(db_url, attack, name, monkeypatch):
    monkeypatch.setenv(roots.TORCHSCRIPT_ENV, "1")
    job = _run_job(db_url, attack[name])
    assert "calls torch.from_file" in job["message"]
    _nowhere(db_url, job, attack)


@pytest.mark.skipif(landlock_abi() < 1, reason="the kernel has no Landlock: dashboard jobs refuse TorchScript here")
@pytest.mark.parametrize("name", ["reader", "writer", "creator"])
def test_without_the_scan_the_process_contains_it(db_url, attack, name, monkeypatch):
    monkeypatch.setattr(job_handlers, "server_trust", lambda: Trust(torchscript=True, confine=True, scan=False,
                                                                       require_landlock=True, model_errors=False))
    job = _run_job(db_url, attack[name])
    assert "its forward raised an error (the dashboard does not show" in job["message"]
    _nowhere(db_url, job, attack)


def test_command_line_runs_a_harmless_archive_contained(tmp_path):
    class Pair(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            f = x.flatten(1)[:, :3]
            return f, 2 * f

    path = tmp_path / "ok.pt"
    torch.jit.save(torch.jit.script(Pair()), str(path))
    model = load_model(path)
    try:
        x = torch.arange(2 * 3 * 2 * 2, dtype=torch.float32).view(2, 3, 2, 2)
        out = model.net(x)
        assert torch.equal(out.features, x.flatten(1)[:, :3]) and torch.equal(out.logits, 2 * x.flatten(1)[:, :3])
    finally:
        model.net.close()


# --- sizes checked before inflating ----------------------------------------------------------

GB, MB = 1_000_000_000, 1_000_000


def _bomb(path: Path, inflated: int) -> None:
    """A torch.save zip whose storage record is ``inflated`` zero bytes, deflated (about inflated / 1000 on disk)."""
    plain = path.with_name("plain.pt")
    torch.save({"w": torch.zeros(4)}, str(plain))
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            if not info.filename.endswith("/data/0"):
                dst.writestr(info, src.read(info))
                continue
            deflated = zipfile.ZipInfo(info.filename)
            deflated.compress_type = zipfile.ZIP_DEFLATED
            with dst.open(deflated, "w", force_zip64=True) as handle:
                chunk = bytes(MB)
                for _ in range(inflated // MB):
                    handle.write(chunk)


PEAK = """
import sys
from engine.checkpoints.loading import CheckpointError, load_model
def peak():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1]) * 1024
before = peak()
try:
    load_model(sys.argv[1], arch="small_cnn", max_bytes=int(sys.argv[2]))
    print("LOADED")
except CheckpointError as exc:
    print("REFUSED", exc)
print("PEAK_DELTA", peak() - before)
"""


def test_a_pt_that_would_inflate_to_a_gigabyte_is_refused_before_it_inflates(tmp_path):
    path = tmp_path / "bomb.pt"
    _bomb(path, GB)
    assert path.stat().st_size < 2 * MB
    with zipfile.ZipFile(path) as archive:
        assert max(i.file_size for i in archive.infolist()) == GB
    run = subprocess.run([sys.executable, "-c", PEAK, str(path), str(100 * MB)], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    out = run.stdout.splitlines()
    assert out[0].startswith("REFUSED") and "would inflate to 1.0 GB" in out[0] and "100.0 MB size limit" in out[0], run
    assert int(out[1].split()[1]) < 20 * MB  # nothing was inflated (the whole record would be 1000 MB)


def test_safetensors_header_larger_than_the_file_is_refused(tmp_path):
    path = tmp_path / "lie.safetensors"
    header = json.dumps({"w": {"dtype": "F32", "shape": [1000, 1000, 1000], "data_offsets": [0, 4 * 10**9]}}).encode()
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(16))
    with pytest.raises(CheckpointError, match=r"tensor w declares F32 \[1000, 1000, 1000\] \(4.0 GB\)"):
        load_model(path, arch="small_cnn")


def test_legacy_torch_format_is_refused_with_how_to_resave(tmp_path):
    path = tmp_path / "old.pt"
    torch.save({"w": torch.zeros(2)}, str(path), _use_new_zipfile_serialization=False)
    with pytest.raises(CheckpointError, match=r"legacy \(pre-1.6\) format.*re-save it"):
        load_model(path, arch="small_cnn")


# --- the upload limit shown is the limit enforced --------------------------------------------


def test_upload_limit_on_the_page_is_the_one_run_app_gives_streamlit(app_db):
    from streamlit import config
    from streamlit.testing.v1 import AppTest

    command = run_app.child_commands(run_app.parse_args(["--max-upload-mb", "123"]), app_db)["dashboard"]
    enforced = int(command[command.index("--server.maxUploadSize") + 1])
    assert enforced == 123
    default = run_app.child_commands(run_app.parse_args([]), app_db)["dashboard"]
    assert default[default.index("--server.maxUploadSize") + 1] == str(run_app.MAX_UPLOAD_MB)
    previous = config.get_option("server.maxUploadSize")
    config.set_option("server.maxUploadSize", enforced)
    try:
        at = AppTest.from_file(str(ROOT / "app" / "app_pages" / "checkpoints.py"), default_timeout=120).run()
        at.radio(key="ck_0_source").set_value("Upload").run()
        assert not at.exception, at.exception
        label = at.get("file_uploader")[0].proto.label
        assert label == "Checkpoint file (up to 123 MB)"
    finally:
        config.set_option("server.maxUploadSize", previous)
