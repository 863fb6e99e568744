"""Features near the float32 maximum (or tiny but nonzero) give the answer float64 gives.

Their sum of squares overflows (or underflows) in float32: before, every such row became 0 and Recall@1 came out
0.00 with no error. The expectations here are worked out independently in float64 with numpy and scikit-learn.
"""
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.metrics import average_precision_score

from engine.cli import main
from engine.core.cell import project_simplex
from engine.core.norms import unit_rows_np
from engine.metrics.retrieval import retrieval_metrics, unit_tensor_rows
from engine.metrics.sharded import Shard, sharded_retrieval_metrics

F32_MAX = float(np.finfo(np.float32).max)


def _cell(seed: int = 0, n: int = 60, d: int = 8, classes: int = 4):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), rng.integers(0, classes, n), rng.normal(size=(n, d)), rng.integers(0, classes, n)


def _at(x: np.ndarray, magnitude: float) -> np.ndarray:
    """Rows of ``x`` scaled so that each row's largest entry is ``magnitude`` (direction kept), as float32."""
    return (x / np.abs(x).max(1, keepdims=True) * magnitude).astype(np.float32)


def _expected(q, ql, g, gl) -> dict[str, float]:
    """Recall@1/@5 and mAP from float64 cosines of the float32 rows, independently of the engine."""
    q64, g64 = np.asarray(q, np.float64), np.asarray(g, np.float64)
    q64 /= np.abs(q64).max(1, keepdims=True)  # exact in float64 for these magnitudes: the direction is all that counts
    g64 /= np.abs(g64).max(1, keepdims=True)
    sims = (q64 / np.linalg.norm(q64, axis=1, keepdims=True)) @ (g64 / np.linalg.norm(g64, axis=1, keepdims=True)).T
    order = np.argsort(-sims, axis=1, kind="stable")
    hits = gl[order] == ql[:, None]
    return {"recall@1": hits[:, 0].mean(), "recall@5": hits[:, :5].any(1).mean(),
            "map": np.mean([average_precision_score(gl == ql[i], sims[i]) for i in range(len(q))])}


@pytest.mark.parametrize("magnitude", [F32_MAX, F32_MAX / 3, 1e30, 1e-30, 1e-41])  # 1e-41: subnormal float32
def test_retrieval_metrics_at_the_float32_extremes_equal_float64(magnitude):
    q, ql, g, gl = _cell()
    qm, gm = _at(q, magnitude), _at(g, magnitude)
    want = _expected(qm, ql, gm, gl)
    got = retrieval_metrics(qm, ql, gm, gl)
    assert want["recall@1"] > 0.1  # the case the overflow got wrong (it gave 0.0)
    for name, value in want.items():
        assert got[name] == pytest.approx(value, abs=1e-9), name
    if magnitude >= np.finfo(np.float32).tiny:  # subnormals hold fewer bits: their directions differ slightly
        assert got == retrieval_metrics(_at(q, 1.0), ql, _at(g, 1.0), gl)  # the same cell at ordinary magnitude


def test_sharded_and_template_cells_at_the_float32_maximum_equal_ordinary_magnitude():
    q, ql, g, gl = _cell(1)
    big, one = (_at(q, F32_MAX), _at(g, F32_MAX)), (_at(q, 1.0), _at(g, 1.0))
    for kw in ({"gallery_kind": "template"}, {"gallery_kind": "template", "same_set": True}, {"same_set": True}):
        qq = gl if kw.get("same_set") else ql
        a = retrieval_metrics(big[1] if kw.get("same_set") else big[0], qq, big[1], gl, **kw)
        b = retrieval_metrics(one[1] if kw.get("same_set") else one[0], qq, one[1], gl, **kw)
        assert a == b and a["recall@1"] > 0, kw
    shards = [Shard(big[1][a:b], gl[a:b], np.arange(a, b)) for a, b in ((0, 25), (25, 60))]
    assert sharded_retrieval_metrics(big[0], ql, shards) == pytest.approx(_expected(big[0], ql, big[1], gl) | {
        "n_queries": 60, "n_valid": 60, "n_no_positive": 0}, abs=1e-9)


def test_unit_rows_keep_direction_and_change_no_ordinary_row():
    x = np.array([[F32_MAX, F32_MAX, -F32_MAX / 2], [1e-30, -1e-30, 0.0], [3.0, 4.0, 0.0], [0.0, 0.0, 0.0]], np.float32)
    want = np.array([[2, 2, -1], [1, -1, 0], [3, 4, 0], [0, 0, 0]], np.float64)
    want /= np.maximum(np.linalg.norm(want, axis=1, keepdims=True), 1e-300)
    np.testing.assert_allclose(unit_rows_np(x), want, atol=1e-7)
    np.testing.assert_allclose(unit_tensor_rows(torch.as_tensor(x)).numpy(), want, atol=1e-7)
    ordinary = torch.as_tensor(np.random.default_rng(0).normal(size=(50, 7)).astype(np.float32))
    assert torch.equal(unit_tensor_rows(ordinary), F.normalize(ordinary, dim=1))  # bit for bit as before


def test_psp_of_logits_near_the_float32_maximum_equals_float64():
    rng = np.random.default_rng(2)
    logits = _at(rng.normal(size=(10, 6)), F32_MAX)
    got = project_simplex(logits, 4)
    x = logits[:, :4].astype(np.float64)
    x -= x.mean(1, keepdims=True)
    want = x / np.linalg.norm(x, axis=1, keepdims=True)
    assert got.dtype == np.float32 and np.isfinite(got).all()
    np.testing.assert_allclose(got, want, atol=1e-6)


def test_evaluate_cli_on_float32_maximum_features_stores_the_float64_answer(tmp_path, capsys):
    big, ordinary = tmp_path / "big", tmp_path / "one"
    expected = []
    for folder, magnitude in ((big, F32_MAX), (ordinary, 1.0)):
        folder.mkdir()
        for t in (1, 2):
            q, ql, g, gl = _cell(10 + t)
            np.savez(folder / f"step_{t}.npz", query_features=_at(q, magnitude), query_labels=ql,
                     gallery_features=_at(g, magnitude), gallery_labels=gl)
            if folder is big:
                expected.append((_at(q, magnitude), ql, _at(g, magnitude), gl))
    url = f"sqlite:///{tmp_path / 'e.db'}"
    assert main(["evaluate", "--features", str(big), "--db", url, "--json", str(tmp_path / "big.json")]) == 0
    assert main(["evaluate", "--features", str(ordinary), "--no-store", "--json", str(tmp_path / "one.json")]) == 0
    capsys.readouterr()
    got = json.loads((tmp_path / "big.json").read_text())
    for t in (0, 1):  # the diagonal cells: step t's queries against its own gallery
        q, ql, g, gl = expected[t]
        want = _expected(q, ql, g, gl)
        assert got["metrics"]["recall@1"]["matrix"][t][t] == pytest.approx(want["recall@1"], abs=1e-9)
        assert got["metrics"]["map"]["matrix"][t][t] == pytest.approx(want["map"], abs=1e-9)
    assert got["metrics"] == json.loads((tmp_path / "one.json").read_text())["metrics"]
    from storage import get_engine, load_matrices, session_scope

    with session_scope(get_engine(url)) as s:
        stored = {m.metric: m.values for m in load_matrices(s, got["experiment_id"])}
    for name in ("recall@1", "map"):
        assert np.array_equal(np.nan_to_num(stored[name], nan=-1.0),
                              np.nan_to_num(np.array(got["metrics"][name]["matrix"], float), nan=-1.0)), name
