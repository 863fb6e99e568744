"""Outputs never delete or replace what this tool did not write (issue 39, "data loss"): ``adapter fit --out ... --force``
replaces an adapter folder only, never a data root, a folder with other files or a link; ``--plan`` never writes
beside a data root."""
from __future__ import annotations

import os

import numpy as np
from support.adapters_export import pairs, run  # noqa: F401 (the fixture)
from support.upgrade_cli import write_folder
from support.upgrade_plan_cli import rotated_back_pair

from engine.adapters.artifact import load_adapter
from engine.cli import main

FIT = ["adapter", "fit", "--kind", "affine", "--pairs", "100", "--resamples", "20", "--no-onnx"]


def fit_argv(root, out) -> list[str]:
    return [*FIT, "--old", str(root / "old.npz"), "--new", str(root / "new.npz"), "--out", str(out)]


def snapshot(folder) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_fit_force_never_replaces_a_data_root(pairs, capsys):  # noqa: F811
    root, _, _ = pairs
    (root / "precious.db").write_bytes(b"SQLite format 3\x00 rows")
    before = snapshot(root)
    code, _, err = run([*fit_argv(root, root), "--force"], capsys)
    assert code == 2 and "is a data root" in err and err.count("\n") == 1
    assert snapshot(root) == before


def test_fit_force_never_replaces_a_folder_holding_other_files(pairs, capsys):  # noqa: F811
    root, _, _ = pairs
    (root / "team").mkdir()
    (root / "team" / "precious.db").write_bytes(b"rows")
    (root / "team" / "adapter.json").write_text("{}")  # an adapter's name beside a file that is not one
    code, _, err = run([*fit_argv(root, root / "team"), "--force"], capsys)
    assert code == 2 and "is not an adapter folder (1 of its 2 entries are not an adapter's files)" in err
    assert sorted(p.name for p in (root / "team").iterdir()) == ["adapter.json", "precious.db"]
    assert not [p for p in root.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_fit_force_replaces_an_adapter_folder_it_wrote(pairs, capsys):  # noqa: F811
    root, _, _ = pairs
    assert run(fit_argv(root, root / "ad"), capsys)[0] == 0
    first = load_adapter(root / "ad").tensors["weight"].copy()
    code, _, err = run([*fit_argv(root, root / "ad"), "--force", "--seed", "5"], capsys)
    assert code == 0, err
    assert sorted(p.name for p in (root / "ad").iterdir()) == ["adapter.json", "adapter.safetensors"]
    assert load_adapter(root / "ad").tensors["weight"].shape == first.shape


def test_fit_force_never_follows_a_link(pairs, capsys):  # noqa: F811
    root, _, _ = pairs
    assert run(fit_argv(root, root / "ad"), capsys)[0] == 0
    os.symlink(root / "ad", root / "link")
    before = snapshot(root / "ad")
    code, _, err = run([*fit_argv(root, root / "link"), "--force"], capsys)
    assert code == 2 and "is a symbolic link" in err
    assert snapshot(root / "ad") == before and os.path.islink(root / "link")


def test_a_plan_named_by_a_data_root_is_refused_and_nothing_is_written_beside_it(tmp_path, capsys):
    folder = write_folder(tmp_path / "f", *rotated_back_pair())
    beside = sorted(os.listdir(tmp_path.parent))
    code = main(["check-upgrade", "--features", str(folder), "--metric", "recall@1", "--resamples", "50",
                 "--plan", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and "--plan's file" in err and "is outside the data roots" in err and err.count("\n") == 1
    assert sorted(os.listdir(tmp_path.parent)) == beside and sorted(os.listdir(tmp_path)) == ["f"]
    assert np.load(folder / "step_1.npz")["query_features"].shape[0] > 0  # the input is untouched
