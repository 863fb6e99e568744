"""Uploaded checkpoints cannot make the worker allocate more than they hold: tensors that claim more elements than
their storage (stride-0 views), a declared class count, or a form that raises the operator's size limit are refused
before anything is allocated (peak memory measured in a child process, under an address-space limit so that a
regression fails fast instead of swapping); identical uploads at the same moment all succeed."""
from __future__ import annotations

import os
import threading
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torchvision

from engine.checkpoints.files import MAX_BYTES_ENV, CheckpointError, server_trust
from engine.checkpoints.loading import load_model
from engine.checkpoints.request import comparison_spec
from engine.checkpoints.torch_zip import check_torch_zip
from peak_memory import MB, measure

HEADROOM = 300 * MB  # what a refusal may cost over the child's baseline; every hostile file below claims GBs


def _load_in_child(path: Path, *, arch: str | None = None, classes: int | None = None, max_bytes: int = 2_000 * MB,
                   server: bool = False, env: dict[str, str] | None = None) -> dict:
    """``load_model`` in a fresh interpreter: its error (or None) and how much its peak RSS grew."""
    setup = "from engine.checkpoints.files import server_trust\nfrom engine.checkpoints.loading import load_model"
    trust = ", trust=server_trust()" if server else ""
    expr = (f"load_model({str(path)!r}, arch={arch!r}, num_classes={classes!r}, max_bytes={max_bytes!r}{trust}) "
            "and None")
    return measure(setup, expr, headroom=HEADROOM, env=env)


def _expanded_resnet18(path: Path, classes: int) -> None:
    """A resnet18 state_dict whose every float tensor is one stored element expanded (stride 0) to its shape,
    and whose classifier claims ``classes`` outputs: a few kB on disk, GBs once materialised."""
    state = torchvision.models.resnet18(num_classes=1).state_dict()
    shapes = {k: v.shape for k, v in state.items()} | {"fc.weight": (classes, 512), "fc.bias": (classes,)}
    torch.save({k: torch.zeros(1).expand(shapes[k]) if v.is_floating_point() else v for k, v in state.items()}, path)


def test_stride0_upload_declaring_gigabytes_is_refused_before_allocating(tmp_path):
    path = tmp_path / "expanded.pt"
    _expanded_resnet18(path, classes=2_000_000)  # fc.weight alone: 2M x 512 float32 = 4.1 GB
    assert path.stat().st_size < 200_000
    with pytest.raises(CheckpointError, match=r"tensor conv1\.weight is a stride-0 \(expanded\) view: shape \[64, 3, 7, 7\]"):
        check_torch_zip(path, 2_000 * MB)
    got = _load_in_child(path, arch="resnet18", classes=2_000_000)
    assert got["error"] is not None and got["error"].startswith("CheckpointError: ") and "stride-0" in got["error"]
    assert "\n" not in got["error"]
    assert got["grew"] < HEADROOM, got


def test_declared_class_count_is_checked_before_the_model_is_built(tmp_path):
    state = torchvision.models.resnet18(num_classes=3).state_dict()
    del state["fc.weight"], state["fc.bias"]  # no classifier: the declared count alone decides its size
    torch.save(state, tmp_path / "headless.pt")
    got = _load_in_child(tmp_path / "headless.pt", arch="resnet18", classes=2_000_000)
    # resnet18 with 2M classes: 11,176,512 backbone parameters + 9,600 BatchNorm statistics + 2M x 513 classifier
    # parameters, float32, and 20 int64 counters: 4,148,744,608 bytes
    assert got["error"] == (f"CheckpointError: {tmp_path / 'headless.pt'}: a resnet18 with 2000000 classes would take "
                            "4.1 GB, over the 2.0 GB size limit; refused before building it"), got
    assert got["grew"] < HEADROOM, got


def test_a_storage_smaller_than_its_view_or_its_record_is_refused(tmp_path):
    path = tmp_path / "short.pt"
    torch.save({"w": torch.zeros(4, 4)[::2, 1:]}, path)  # a strided but dense view: accepted
    check_torch_zip(path, MB)
    with zipfile.ZipFile(path) as src:  # now make the view claim 100 rows of its 16-element storage
        entries = {name: src.read(name) for name in src.namelist()}
    pkl = next(n for n in entries if n.endswith("/data.pkl"))
    forged = tmp_path / "forged.pt"
    with zipfile.ZipFile(forged, "w") as dst:
        for name, data in entries.items():
            dst.writestr(name, data.replace(b"K\x02K\x03\x86", b"KdK\x03\x86") if name == pkl else data)
    with pytest.raises(CheckpointError, match=r"tensor w ends at element 796 \(offset 1, shape \[100, 3\], "
                                               r"strides \[8, 1\]\) but its storage holds 16"):
        check_torch_zip(forged, MB)
    lying = tmp_path / "lying.pt"  # the pickle claims 16 elements, the record holds 2
    with zipfile.ZipFile(lying, "w") as dst:
        for name, data in entries.items():
            dst.writestr(name, data[:8] if name.endswith("/data/0") else data)
    with pytest.raises(CheckpointError, match=r"storage 0 declares 64 B but its record holds 8 B: truncated or corrupt"):
        check_torch_zip(lying, MB)


def test_views_sharing_one_storage_count_once_each(tmp_path):
    base = torch.zeros(1000, 1000)
    torch.save({f"w{i}": base for i in range(30)}, tmp_path / "aliases.pt")  # 4 MB stored, 30 x 4 MB once loaded
    assert (tmp_path / "aliases.pt").stat().st_size < 5 * MB
    with pytest.raises(CheckpointError, match=r"its tensors would take 120\.0 MB once loaded, over the 50\.0 MB"):
        check_torch_zip(tmp_path / "aliases.pt", 50 * MB)
    check_torch_zip(tmp_path / "aliases.pt", 200 * MB)


def _zip_bomb(path: Path, inflated: int) -> None:
    """A torch.save zip whose one storage record inflates to ``inflated`` bytes of zeros from ~1/1000 of that."""
    torch.save({"w": torch.zeros(1)}, path)
    with zipfile.ZipFile(path) as src:
        entries = {name: src.read(name) for name in src.namelist()}
    path.unlink()
    with zipfile.ZipFile(path, "w") as dst:
        for name, data in entries.items():
            if name.endswith("/data/0"):
                info = zipfile.ZipInfo(name)
                info.compress_type = zipfile.ZIP_DEFLATED
                with dst.open(info, "w", force_zip64=True) as out:
                    block = bytes(MB)
                    for _ in range(inflated // MB):
                        out.write(block)
            else:
                dst.writestr(name, data)


def test_the_form_cannot_raise_the_operators_limit(tmp_path, monkeypatch):
    monkeypatch.setenv(MAX_BYTES_ENV, "50MB")
    torch.save({"w": torch.zeros(3)}, tmp_path / "m.pt")
    spec = {"models": [{"path": str(tmp_path / "m.pt"), "arch": "small_cnn"}], "dataset": "digits",
            "max_file_bytes": "5GB"}
    with pytest.raises(ValueError, match=r"^the largest checkpoint may be at most 50\.0 MB on this server \(its "
                                         r"operator's --max-checkpoint-size\), not 5\.0 GB$"):
        comparison_spec(spec, trust=server_trust())
    assert comparison_spec({**spec, "max_file_bytes": "20MB"}, trust=server_trust()).max_file_bytes == 20 * MB
    assert comparison_spec(spec).max_file_bytes == 5_000 * MB  # the command line: the operator's own files

    bomb = tmp_path / "bomb.pt"
    _zip_bomb(bomb, 400 * MB)  # what a browser asking for 5GB would have the worker inflate
    assert bomb.stat().st_size < 2 * MB
    got = _load_in_child(bomb, arch="small_cnn", max_bytes=5_000 * MB, server=True,
                         env={MAX_BYTES_ENV: "50MB", "COMPATLAB_DATA_ROOTS": str(tmp_path)})
    assert got["error"] is not None and "would inflate to 400.0 MB" in got["error"] and "50.0 MB size limit" in got["error"]
    assert got["grew"] < HEADROOM, got


def test_server_ceiling_is_read_from_the_environment(monkeypatch):
    from engine.checkpoints.files import check_ceiling, server_max_bytes

    monkeypatch.delenv(MAX_BYTES_ENV, raising=False)
    assert server_max_bytes() == 2_000 * MB and check_ceiling(2_000 * MB) == 2_000 * MB
    monkeypatch.setenv(MAX_BYTES_ENV, "1.5GB")
    assert server_max_bytes() == 1_500 * MB
    with pytest.raises(ValueError, match="at most 1.5 GB on this server"):
        check_ceiling(1_500 * MB + 1)


def test_legit_checkpoints_still_load(tmp_path):
    from support.checkpoints_factory import save_state_dict_pt

    net = save_state_dict_pt(tmp_path / "m.pt", num_classes=5, width=12).eval()
    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    loaded = load_model(tmp_path / "m.pt", arch="small_cnn", trust=server_trust())
    with torch.inference_mode():
        assert torch.equal(loaded.net.eval()(x).logits, net(x).logits)


@pytest.mark.parametrize("round_", range(10))  # a collision needs two writers in the same instant: try often
def test_concurrent_identical_uploads_all_succeed_with_one_whole_file(tmp_path, round_):
    from app.checkpoint_form import save_upload

    data = os.urandom(8 * MB)
    upload = SimpleNamespace(name="same model.pt", getvalue=lambda: data)
    folder = tmp_path / "uploads"
    count = 16
    start = threading.Barrier(count)
    results: list[Path] = []
    errors: list[BaseException] = []

    def save() -> None:
        start.wait()
        try:
            results.append(save_upload(upload, folder))
        except BaseException as exc:  # noqa: BLE001 (collected and reported below)
            errors.append(exc)

    threads = [threading.Thread(target=save) for _ in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [], errors[:3]
    assert len(results) == count and len(set(results)) == 1
    assert results[0].read_bytes() == data
    assert sorted(p.name for p in folder.iterdir()) == [results[0].name]  # no temporary file left behind


def test_the_checkpoints_form_refuses_a_limit_over_the_operators(app_db, tmp_path, monkeypatch):
    from support.app_checkpoints import fill, jobs, open_page, press

    from app.widgets import plain
    from support.checkpoints_factory import save_state_dict_pt, save_step_checkpoint, write_image_folder

    monkeypatch.setenv(MAX_BYTES_ENV, "1GB")
    save_state_dict_pt(tmp_path / "old.pt", num_classes=4, width=8)
    save_step_checkpoint(tmp_path / "new.safetensors", num_classes=4, width=8, seed=1)
    files = {"old": tmp_path / "old.pt", "new": tmp_path / "new.safetensors",
             "images": write_image_folder(tmp_path / "imgs", classes=4, per_class=3, size=16)}
    at = fill(open_page(), files)
    at.text_input(key="ck_max_size").input("3GB")
    press(at.run(), "launch")
    assert [e.value for e in at.error] == [plain("Largest checkpoint: the largest checkpoint may be at most 1.0 GB "
                                                 "on this server (its operator's --max-checkpoint-size), not 3.0 GB.")]
    assert jobs(app_db) == []
    at.text_input(key="ck_max_size").input("")  # empty: the operator's limit
    press(at.run(), "launch")
    assert not at.error, [e.value for e in at.error]
    at.text_input(key="ck_max_size").input("500MB")
    press(at.run(), "launch")
    assert sorted(j["payload"]["spec"]["max_file_bytes"] for j in jobs(app_db)) == [500 * MB, 1_000 * MB]


def test_a_step_checkpoint_header_declaring_millions_of_classes_is_refused_before_building(tmp_path):
    import json
    import struct

    from support.checkpoints_factory import save_step_checkpoint

    path = tmp_path / "step_1.safetensors"
    save_step_checkpoint(path, num_classes=4, width=8)
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + length])
    meta = json.loads(header["__metadata__"]["meta"])
    meta["num_classes"] = 100_000_000  # 100M x 8 features: 3.6 GB; the tensors still hold a 4-class head
    header["__metadata__"]["meta"] = json.dumps(meta)
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + length:])
    got = _load_in_child(path)
    assert got["error"] is not None and got["error"].startswith(f"CheckpointError: {path}: a small_cnn network with a "
                                                                "100000000-output linear head would take "), got
    assert got["error"].endswith("over the 2.0 GB size limit; refused before building it"), got
    assert got["grew"] < HEADROOM, got


def test_the_form_names_a_stride0_upload_before_queueing(app_db, tmp_path):
    from support.app_checkpoints import fill, jobs, open_page, press

    from app.widgets import plain
    from support.checkpoints_factory import save_step_checkpoint, write_image_folder

    _expanded_resnet18(tmp_path / "old.pt", classes=2_000_000)
    save_step_checkpoint(tmp_path / "new.safetensors", num_classes=4, width=8, seed=1)
    files = {"old": tmp_path / "old.pt", "new": tmp_path / "new.safetensors",
             "images": write_image_folder(tmp_path / "imgs", classes=4, per_class=3, size=16)}
    at = fill(open_page(), files)
    at.selectbox(key="ck_0_arch").select("resnet18")
    at.number_input(key="ck_0_num_classes").set_value(0)
    at.text_area(key="ck_0_classes").input("")
    press(at.run(), "launch")
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and plain("tensor conv1.weight is a stride-0 (expanded) view") in errors[0], errors
    assert jobs(app_db) == []


def test_plain_values_beside_the_weights_are_read_as_torch_load_reads_them(tmp_path):
    from support.checkpoints_factory import small_net

    net = small_net(3, width=8).eval()
    torch.save({"epoch": 3, "shape": torch.Size([2, 3]), "device": torch.device("cpu"), "tags": {"best"},
                "note": b"bytes", "optimizer": {"state": {0: {"step": torch.tensor(5.0)}}, "betas": (0.9, 0.999)},
                "state_dict": net.state_dict()}, tmp_path / "wrapped.pt")
    check_torch_zip(tmp_path / "wrapped.pt", 10 * MB)
    x = torch.rand(2, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        assert torch.equal(load_model(tmp_path / "wrapped.pt", arch="small_cnn").net.eval()(x).logits, net(x).logits)
