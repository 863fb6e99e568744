"""``python -m engine evaluate`` on feature folders generated here, good and bad."""
import json
import subprocess
import sys

import numpy as np
import pytest
from sqlalchemy import func, select

from engine.cli import main
from storage import CompatibilityMatrix, Experiment, FeatureSet, get_engine, session_scope
from support.cli_evaluate import _hand_folder


def _write(folder, T=2, n=30, d=4, seed=0, override=None):
    rng = np.random.default_rng(seed)
    folder.mkdir(exist_ok=True)
    for t in range(1, T + 1):
        arrays = dict(query_features=rng.normal(size=(n, d)).astype(np.float32), query_labels=rng.integers(0, 3, n),
                      gallery_features=rng.normal(size=(n, d)).astype(np.float32), gallery_labels=rng.integers(0, 3, n))
        arrays.update((override or {}).get(t, {}))
        np.savez(folder / f"step_{t}.npz", **arrays)
    return folder




def _count(url, model):
    with session_scope(get_engine(url)) as s:
        return s.scalar(select(func.count()).select_from(model))


def test_evaluate_hand_checked_folder_json_and_database(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    out = tmp_path / "out.json"
    assert main(["evaluate", "--features", str(_hand_folder(tmp_path / "f")), "--metric", "recall@1", "--json", str(out), "--db", url]) == 0
    data = json.loads(out.read_text())["metrics"]["recall@1"]
    assert data["matrix"][0] == [1.0, None]
    assert data["matrix"][1][0] == pytest.approx(2 / 3)
    # ECC: 2/3 > 1.0 fails -> AC 0, ACA 0; AA = (1 + 2/3 + C22) / 3
    # q2 vs g2: [1,.1] -> class 0 hit; [1,1.1] -> class 1 hit; [.2,1] -> class 1, a miss
    assert data["matrix"][1][1] == pytest.approx(2 / 3)
    assert data["AC"] == 0.0 and data["ACA"] == 0.0  # 2/3 > 1.0 fails ECC
    assert data["AA"] == pytest.approx((1 + 2 / 3 + 2 / 3) / 3)
    assert data["valid_queries"] == [[3, None], [3, 3]]
    printed = capsys.readouterr().out
    assert "66.67*" in printed and "AC=0.00" in printed
    assert _count(url, Experiment) == 1 and _count(url, CompatibilityMatrix) == 1 and _count(url, FeatureSet) == 4


def test_evaluate_exports_and_template_protocol(tmp_path, capsys):
    folder = _write(tmp_path / "f", T=3)
    assert main(["evaluate", "--features", str(folder), "--protocol", "template", "--same-set", "--export", "latex", "--no-store"]) == 2
    assert "one query per gallery item" not in capsys.readouterr().out  # error goes to stderr
    assert main(["evaluate", "--features", str(folder), "--gallery-kind", "template", "--export", "latex", "--no-store"]) == 0
    assert "\\begin{tabular}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "override, message",
    [
        ({2: dict(query_features=np.ones((30, 5), np.float32), gallery_features=np.ones((30, 5), np.float32))}, "dimensions differ between steps"),
        ({1: dict(gallery_features=np.ones((30, 5), np.float32))}, "step_1.npz: query_features are 4-d but gallery_features are 5-d"),
        ({2: dict(query_features=np.full((30, 4), np.nan, np.float32))}, "step_2.npz: query_features has NaN/inf"),
        ({1: dict(gallery_labels=np.zeros(29, int))}, "step_1.npz: gallery_labels has 29 labels for 30"),
    ],
)
def test_bad_folders_exit_2_with_one_line_and_store_nothing(tmp_path, override, message):
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    folder = _write(tmp_path / "f", override=override)
    proc = subprocess.run([sys.executable, "-m", "engine", "evaluate", "--features", str(folder), "--db", url],
                          capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "db.sqlite").exists() or _count(url, Experiment) == 0


def test_missing_keys_and_gaps(tmp_path, capsys):
    folder = tmp_path / "f"
    folder.mkdir()
    np.savez(folder / "step_1.npz", query_features=np.ones((2, 2)))
    assert main(["evaluate", "--features", str(folder), "--no-store"]) == 2
    assert "step_1.npz: missing array(s) query_labels, gallery_features, gallery_labels" in capsys.readouterr().err
    _write(tmp_path / "g", T=1)
    (tmp_path / "g" / "step_1.npz").rename(tmp_path / "g" / "step_2.npz")
    assert main(["evaluate", "--features", str(tmp_path / "g"), "--no-store"]) == 2
    assert "numbered 1..T without gaps" in capsys.readouterr().err


def test_pickled_object_arrays_are_refused(tmp_path, capsys):
    folder = tmp_path / "f"
    folder.mkdir()
    np.savez(folder / "step_1.npz", query_features=np.array([object()], dtype=object), query_labels=np.zeros(1),
             gallery_features=np.ones((1, 2)), gallery_labels=np.zeros(1, int))
    assert main(["evaluate", "--features", str(folder), "--no-store"]) == 2
    assert "cannot be read as a .npz of plain arrays" in capsys.readouterr().err


def test_evaluate_reports_ties_and_when_they_decide_the_verdict(tmp_path, capsys):
    # gallery: 4 one-hot items per class; model 1's queries: half on their class, half on the next (0.5, no tie);
    # model 2's queries halfway between their class and the next: 4 positives tie 4 negatives (pessimistic 0,
    # expected 0.5, optimistic 1), so the cross-test fails when tied negatives rank first and passes when they rank after
    folder = tmp_path / "f"
    folder.mkdir()
    eye = np.eye(3, dtype=np.float32)
    labels = np.repeat(np.arange(3), 4)
    old = eye[np.where(np.arange(12) % 4 < 2, labels, (labels + 1) % 3)]
    new = (eye[labels] + eye[(labels + 1) % 3]) / np.float32(np.sqrt(2))
    for t, q in ((1, old), (2, new)):
        np.savez(folder / f"step_{t}.npz", query_features=q, query_labels=labels, gallery_features=eye[labels],
                 gallery_labels=labels)
    url, out = f"sqlite:///{tmp_path / 'db.sqlite'}", tmp_path / "out.json"
    assert main(["evaluate", "--features", str(folder), "--metric", "recall@1", "--json", str(out), "--db", url]) == 0
    ties = json.loads(out.read_text())["metrics"]["recall@1"]["tie_readings"]
    assert ties["tied"][1][0] == 12 and ties["share"][1][0] == 1.0 and ties["decide"][1][0] is True
    assert [ties[r][1][0] for r in ("pessimistic", "expected", "optimistic")] == [0.0, 0.5, 1.0]
    printed = capsys.readouterr().out
    assert "M2 → M1: not compatible" in printed
    assert "ties decide it (not compatible when tied negatives rank first, compatible when they rank after)" in printed
    assert "M2 → M1: 12 queries tied (100.0 %); 0.00 / 50.00 / 100.00 %" in printed
    with session_scope(get_engine(url)) as s:
        stored = s.scalars(select(CompatibilityMatrix)).one().summary["tie_readings"]
    assert stored["decide"][1][0] is True and stored["tolerance"] == 1e-6
