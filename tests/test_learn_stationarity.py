"""Learn page 3, stationarity: a short two-step training, with drift and Recall@1 recomputed by hand."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from streamlit.testing.v1 import AppTest

from engine.learn.stationarity import FIRST_CLASSES, build_net, polygon_prototypes, run_stationarity

PAGE = str(Path(__file__).resolve().parents[1] / "app" / "learn" / "stationarity.py")
EPOCHS = 2  # enough to exercise both steps; the page's default (20) is for people


@pytest.fixture(scope="module")
def run():
    return run_stationarity(epochs=EPOCHS, seed=0)


def final_features(run, head: str, step: int) -> tuple[np.ndarray, np.ndarray]:
    f = run.features
    f = f[(f["head"] == head) & (f["step"] == step) & (f["epoch"] == EPOCHS)]
    return f[["x", "y"]].to_numpy(), f["label"].to_numpy()


def loop_recall1(query: np.ndarray, gallery: np.ndarray, labels: np.ndarray) -> tuple[float, float]:
    """Leave-one-out Recall@1 written out, and how far float32 rounding could move it.

    A query is a hit when its best same-class gallery item beats every other class (float64 cosines).
    In 2-D many neighbours are closer than float32 (the engine's precision) can tell apart, and the
    engine counts a tie as a miss; queries whose two bests differ by less than 1e-6 may go either way,
    so their share is returned as the tolerance.
    """
    q = query / np.linalg.norm(query, axis=1, keepdims=True)
    g = gallery / np.linalg.norm(gallery, axis=1, keepdims=True)
    hits = unsure = 0
    for i in range(len(q)):
        sims = g @ q[i]
        same = labels == labels[i]
        same[i] = False  # leave the query's own image out
        gap = sims[same].max() - sims[labels != labels[i]].max()
        hits += gap > 0
        unsure += abs(gap) < 1e-6
    return hits / len(q), unsure / len(q)


def by_hand(run, head: str) -> dict[str, tuple[float, float]]:
    """Mean |drift| of the old digits' mean direction and the two Recall@1 on digits 0-4 (value, tolerance)."""
    f1, labels = final_features(run, head, 1)
    f2, _ = final_features(run, head, 2)
    drifts = []
    for y in range(FIRST_CLASSES):
        a1 = np.arctan2(*f1[labels == y].mean(0)[::-1])
        a2 = np.arctan2(*f2[labels == y].mean(0)[::-1])
        drifts.append(abs((np.degrees(a2 - a1) + 180) % 360 - 180))
    old = labels < FIRST_CLASSES
    return {"drift": (float(np.mean(drifts)), 1e-3), "self": loop_recall1(f1[old], f1[old], labels[old]),
            "cross": loop_recall1(f2[old], f1[old], labels[old])}


def close(value: float | str, expected: tuple[float, float], rounding: float = 0.0) -> bool:
    return abs(float(str(value).rstrip("°")) - expected[0]) <= expected[1] + rounding + 1e-12


def test_polygon_prototypes():
    W = polygon_prototypes(10).numpy()
    np.testing.assert_allclose(np.linalg.norm(W, axis=1), 1.0, atol=1e-6)
    angles = np.degrees(np.arctan2(W[:, 1], W[:, 0])) % 360
    np.testing.assert_allclose(angles, np.arange(10) * 36.0, atol=1e-4)
    assert build_net("fixed", num_outputs=5, width=8, seed=0).head.num_outputs == 10  # pre-allocated
    assert build_net("learnable", num_outputs=5, width=8, seed=0).head.num_outputs == 5


def test_run_records_every_epoch_of_both_steps(run):
    n_test = len(run.features) // (2 * 2 * (EPOCHS + 1))
    assert n_test * 2 * 2 * (EPOCHS + 1) == len(run.features)
    counts = run.prototypes.groupby(["head", "step"])["epoch"].nunique()
    assert (counts == EPOCHS + 1).all()
    learnable = run.prototypes[run.prototypes["head"] == "learnable"].groupby("step")["label"].max()
    assert learnable.to_dict() == {1: 4, 2: 9}  # the learnable head grows from 5 to 10 outputs


def test_fixed_classifier_never_moves(run):
    fixed = run.prototypes[run.prototypes["head"] == "fixed"]
    expected = polygon_prototypes(10).numpy()
    for (_, _), group in fixed.groupby(["step", "epoch"]):
        np.testing.assert_allclose(group[["x", "y"]].to_numpy(), expected[group["label"].to_numpy()], atol=1e-6)


def test_drift_and_recall_match_a_computation_by_hand(run):
    for head in ("learnable", "fixed"):
        row = run.summary.set_index("head").loc[head]
        expected = by_hand(run, head)
        assert close(row["mean_abs_drift_deg"], expected["drift"])
        assert close(row["self_test"], expected["self"]) and close(row["cross_test"], expected["cross"])
        assert row["ecc_passes"] == (row["cross_test"] > row["self_test"])


def test_run_is_seeded_restores_threads_and_respects_the_start():
    torch.set_num_threads(2)
    a = run_stationarity(epochs=1, step2_init="scratch")
    assert torch.get_num_threads() == 2
    b = run_stationarity(epochs=1, step2_init="scratch")
    assert a.features.equals(b.features) and a.summary.equals(b.summary)
    f = a.features
    step1_end = f[(f["step"] == 1) & (f["epoch"] == 1)][["x", "y"]].to_numpy()
    step2_start = f[(f["step"] == 2) & (f["epoch"] == 0)][["x", "y"]].to_numpy()
    assert not np.allclose(step1_end, step2_start)  # from scratch: step 2 starts from a fresh network
    with pytest.raises(ValueError, match="step2_init"):
        run_stationarity(epochs=1, step2_init="resume")


def metric_values(at: AppTest) -> list[str]:
    return [m.value for m in at.metric]


def test_page_trains_shows_the_numbers_and_steps_through_epochs(run):
    at = AppTest.from_file(PAGE, default_timeout=120)
    at.session_state["st_epochs"] = EPOCHS  # start with a short training instead of the page's 20 epochs
    at.run()
    assert not at.exception
    values = metric_values(at)  # per head: drift, ECC, self-test, cross-test
    for offset, head in ((0, "learnable"), (4, "fixed")):
        expected = by_hand(run, head)
        assert close(values[offset], expected["drift"], rounding=0.05)
        assert close(values[offset + 2], expected["self"], rounding=5e-4)
        assert close(values[offset + 3], expected["cross"], rounding=5e-4)
        assert values[offset + 1] == ("passes" if float(values[offset + 3]) > float(values[offset + 2]) else "fails")
    assert at.slider(key="st_epoch").value == EPOCHS

    at.radio(key="st_step").set_value(2)
    at.slider(key="st_epoch").set_value(1)
    at.toggle(key="st_normalise").set_value(True)
    at.run()
    assert not at.exception and metric_values(at) == values  # stepping through only redraws

    at.slider(key="st_epoch").set_value(EPOCHS)
    at.slider(key="st_epochs").set_value(1)  # a new training happens only when the form is submitted
    at.run()
    assert metric_values(at) == values
    at.slider(key="st_epochs").set_value(1)
    at.radio(key="st_start").set_value("Train from scratch (same seed)")
    at.button[0].click().run()
    assert not at.exception
    other = run_stationarity(epochs=1, step2_init="scratch").summary.set_index("head")
    assert metric_values(at)[3] == f"{other.loc['learnable', 'cross_test']:.3f}"
    assert at.slider(key="st_epoch").max == 1 and at.slider(key="st_epoch").value == 1  # clamped to the new run
