"""The recovery forecast in the plan: read on the check's own queries before any adapter is fitted, printed first."""
from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.linalg import orthogonal_procrustes
from support.upgrade_cli import write_folder
from support.upgrade_plan_cli import rotated_back_pair

from engine.cli import main
from engine.metrics.compatibility import CellFeatures
from engine.upgrade.migration import FORECAST_PAIRS, forecast_of
from engine.upgrade.verdict import check_upgrade


def unit(x: np.ndarray) -> np.ndarray:
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def hits_at_1(query: np.ndarray, labels: np.ndarray, gallery: np.ndarray, gallery_labels: np.ndarray) -> np.ndarray:
    """Recall@1 per query by brute force: the label of the gallery item of highest cosine."""
    return (gallery_labels[np.argmax(unit(query) @ unit(gallery).T, axis=1)] == labels).astype(np.float64)


def noisy_rotation_pair() -> tuple[CellFeatures, CellFeatures]:
    """A rotated-back pair whose new gallery carries noise: an orthogonal map recovers part of the way, not all."""
    old, new = rotated_back_pair()
    rng = np.random.default_rng(3)
    return old, CellFeatures(new.query + 0.6 * rng.normal(size=new.query.shape), new.query_labels,
                             new.gallery + 0.6 * rng.normal(size=new.gallery.shape), new.gallery_labels)


def test_the_forecast_is_the_calibrated_formula_on_inputs_computed_by_hand():
    """The inputs recomputed independently (scipy's orthogonal Procrustes, brute-force Recall@1), then the forecast's
    point: the paired ratio adapted/old over old/old plus bias x residual, times the ceiling old/old / new/new."""
    from engine.upgrade.forecast import CALIBRATION

    old, new = noisy_rotation_pair()
    report = check_upgrade(old, new, metric="recall@1", orderings=(), resamples=200)
    got, why = forecast_of(old, new, report)
    assert why is None and got is not None
    m = min(FORECAST_PAIRS, len(old.gallery) // 2)
    rows = np.random.default_rng(report.seed).permutation(len(old.gallery))[:m]
    w, _ = orthogonal_procrustes(unit(new.gallery[rows]), unit(old.gallery[rows]))
    residual = 1 - np.mean(np.sum(unit(unit(new.query) @ w) * unit(old.query), axis=1))
    oo = hits_at_1(old.query, old.query_labels, old.gallery, old.gallery_labels)
    nn = hits_at_1(new.query, new.query_labels, new.gallery, new.gallery_labels)
    adapted = hits_at_1(unit(new.query) @ w, old.query_labels, old.gallery, old.gallery_labels)
    share_of_old = adapted.mean() / oo.mean() + CALIBRATION.bias * residual
    # float64 throughout; scipy's SVD and the engine's are different computations of one map: agree to 1e-9
    assert got.residual == pytest.approx(residual, abs=1e-9)
    assert got.share_of_old == pytest.approx(share_of_old, abs=1e-9)
    assert got.share_of_new == pytest.approx(share_of_old * oo.mean() / nn.mean(), abs=1e-9)
    assert got.old_lo < got.share_of_old < got.old_hi and got.new_lo < got.share_of_new < got.new_hi
    assert got.n_queries == len(oo)


def test_the_cli_prints_the_forecast_before_the_fitted_recovery_and_stores_it_in_the_plan(tmp_path, capsys):
    folder = write_folder(tmp_path / "f", *noisy_rotation_pair())
    code = main(["check-upgrade", "--features", str(folder), "--name", "v1", "--name", "v2", "--metric", "recall@1",
                 "--resamples", "200", "--json", str(tmp_path / "r.json"), "--plan", str(tmp_path / "plan")])
    assert code in (1, 3)
    out = capsys.readouterr().out.splitlines()
    at = [i for i, line in enumerate(out) if line.startswith("  plan forecast: a Procrustes adapter should recover ")]
    fitted = [i for i, line in enumerate(out) if line.startswith("  plan recovery: adapter procrustes")]
    assert len(at) == 1 and fitted and at[0] < fitted[0]
    plan = json.loads((tmp_path / "plan.json").read_text())
    f = plan["forecast"]
    assert f["level"] == 0.9 and f["new_lo"] <= f["share_of_new"] <= f["new_hi"]
    assert f"{100 * f['share_of_new']:.0f} % of a full re-embedding (v2/v2; 90 % prediction interval" in out[at[0]]
    assert "- forecast: a Procrustes adapter should recover" in plan["markdown"]


def test_two_widths_get_no_forecast_and_say_why():
    old, new = rotated_back_pair()
    narrow = CellFeatures(new.query[:, :-2], new.query_labels, new.gallery[:, :-2], new.gallery_labels)
    report = check_upgrade(old, new, metric="recall@1", orderings=(), resamples=100)  # a check needs one width
    got, why = forecast_of(old, narrow, report)
    assert got is None and why.startswith("no recovery forecast: the forecast's orthogonal map needs one width")
