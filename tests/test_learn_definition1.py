"""Learn page 1, Definition 1 by hand: pair counts against a plain loop, ECC against a brute-force search."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from streamlit.testing.v1 import AppTest

from engine.learn.definition1 import definition1_pairs, ecc_numbers, two_model_clusters, violation_counts
from engine.metrics import definition1_check

PAGE = str(Path(__file__).resolve().parents[1] / "app" / "learn" / "definition1.py")


def distance(a, b, kind: str) -> float:
    if kind == "euclidean":
        return math.dist(a, b)
    return 1.0 - (a[0] * b[0] + a[1] * b[1]) / (math.hypot(*a) * math.hypot(*b))


def loop_counts(old, new, labels, kind: str, reference: str) -> dict[str, int]:
    """Definition 1 over ordered pairs i != j, written as the paper states it."""
    out = {"1a_pairs": 0, "1a_violated": 0, "1b_pairs": 0, "1b_violated": 0}
    for i in range(len(labels)):
        for j in range(len(labels)):
            if i == j:
                continue
            cross = distance(old[i], new[j], kind)
            if labels[i] == labels[j]:
                out["1a_pairs"] += 1
                out["1a_violated"] += not cross <= distance(old[i], old[j], kind)
            else:
                ref = old if reference == "old" else new
                out["1b_pairs"] += 1
                out["1b_violated"] += not cross >= distance(ref[i], ref[j], kind)
    return out


def loop_recall1(query, gallery, labels) -> float:
    """Leave-one-out Recall@1 written out: a hit when the best same-class gallery item beats every other class
    by cosine similarity (a tie with another class is a miss, the engine's "pessimistic" rule)."""
    q = query / np.linalg.norm(query, axis=1, keepdims=True)
    g = gallery / np.linalg.norm(gallery, axis=1, keepdims=True)
    hits = 0
    for i in range(len(q)):
        sims = g @ q[i]
        same = labels == labels[i]
        same[i] = False
        hits += sims[same].max() > sims[labels != labels[i]].max()
    return hits / len(q)


def arrays(frame):
    return frame[["old_x", "old_y"]].to_numpy(), frame[["new_x", "new_y"]].to_numpy(), frame["label"].to_numpy()


@pytest.mark.parametrize("kind", ["cosine", "euclidean"])
@pytest.mark.parametrize("reference", ["old", "new"])
def test_pair_counts_match_a_plain_loop(kind, reference):
    old, new, labels = arrays(two_model_clusters(num_classes=3, per_class=5, spread_old=0.5, spread_new=0.3,
                                                 drift_deg=20, shared_noise=0.3, seed=4))
    counts = violation_counts(definition1_pairs(old, new, labels, distance=kind, reference_1b=reference))
    assert counts == loop_counts(old, new, labels, kind, reference)
    assert counts["1a_pairs"] == 3 * 5 * 4 and counts["1b_pairs"] == 15 * 14 - 60


@pytest.mark.parametrize("reference", ["old", "new"])
def test_exact_fractions_agree_with_the_sampled_engine_check(reference):
    old, new, labels = arrays(two_model_clusters(num_classes=4, per_class=8, spread_old=0.6, spread_new=0.3, seed=1))
    counts = violation_counts(definition1_pairs(old, new, labels, reference_1b=reference))
    sampled = definition1_check(old, new, labels, n_pairs=100_000, seed=0, reference_1b=reference)
    assert sampled["1a_fraction"] == pytest.approx(1 - counts["1a_violated"] / counts["1a_pairs"], abs=0.01)
    assert sampled["1b_fraction"] == pytest.approx(1 - counts["1b_violated"] / counts["1b_pairs"], abs=0.01)


def test_ecc_numbers_match_a_brute_force_search():
    old, new, labels = arrays(two_model_clusters(num_classes=4, per_class=6, spread_old=0.6, spread_new=0.3, seed=2))
    ecc = ecc_numbers(old, new, labels)
    assert ecc["old_self"] == pytest.approx(loop_recall1(old, old, labels))
    assert ecc["cross"] == pytest.approx(loop_recall1(new, old, labels))
    assert ecc["new_self"] == pytest.approx(loop_recall1(new, new, labels))
    assert ecc["passes"] == (ecc["cross"] > ecc["old_self"])


def test_identical_models_satisfy_every_pair_but_fail_the_strict_criterion():
    old, new, labels = arrays(two_model_clusters(num_classes=4, per_class=8, spread_old=0.4, spread_new=0.4,
                                                 shared_noise=1.0, seed=0))
    np.testing.assert_allclose(old, new)
    counts = violation_counts(definition1_pairs(old, new, labels))
    assert counts["1a_violated"] == counts["1b_violated"] == 0
    ecc = ecc_numbers(old, new, labels)
    assert ecc["cross"] == ecc["old_self"] and not ecc["passes"]


def test_clusters_are_seeded_and_validated():
    a, b = two_model_clusters(seed=3), two_model_clusters(seed=3)
    assert a.equals(b) and not a.equals(two_model_clusters(seed=4))
    with pytest.raises(ValueError, match="correlation"):
        two_model_clusters(shared_noise=1.5)
    with pytest.raises(ValueError, match="2 classes"):
        two_model_clusters(num_classes=1)


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def page_data(at: AppTest):
    s = at.session_state
    return arrays(two_model_clusters(num_classes=s["d1_classes"], per_class=s["d1_per_class"],
                                     spread_old=s["d1_spread_old"], spread_new=s["d1_spread_new"],
                                     drift_deg=s["d1_drift"], shared_noise=s["d1_shared"], seed=s["d1_seed"]))


def check_page(at: AppTest, kind: str, reference: str) -> None:
    assert not at.exception
    old, new, labels = page_data(at)
    expected = loop_counts(old, new, labels, kind, reference)
    shown = metrics(at)
    assert shown["(1a) violated pairs"] == f"{expected['1a_violated']} / {expected['1a_pairs']}"
    assert shown["(1b) violated pairs"] == f"{expected['1b_violated']} / {expected['1b_pairs']}"
    holds = expected["1a_violated"] == expected["1b_violated"] == 0
    assert shown["Definition 1 (all pairs)"] == ("holds" if holds else "fails")
    self_test, cross = loop_recall1(old, old, labels), loop_recall1(new, old, labels)
    assert shown["Self-test R@1 (old → old)"] == f"{self_test:.3f}"
    assert shown["Cross-test R@1 (new → old)"] == f"{cross:.3f}"
    assert shown["ECC: cross-test > self-test"] == ("passes" if cross > self_test else "fails")


def test_page_counts_and_ecc_follow_the_controls():
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    check_page(at, "cosine", "old")
    assert metrics(at)["ECC: cross-test > self-test"] == "passes"  # the opening preset: ECC passes, pairs fail

    at.slider(key="d1_classes").set_value(3)
    at.slider(key="d1_per_class").set_value(5)
    at.slider(key="d1_drift").set_value(30)
    at.slider(key="d1_spread_new").set_value(0.5)
    at.radio(key="d1_distance").set_value("euclidean")
    at.toggle(key="d1_reference_new").set_value(True)
    at.run()
    check_page(at, "euclidean", "new")

    at.selectbox(key="d1_focus").set_value("image 2")
    at.radio(key="d1_show").set_value("(1b) different class")
    at.run()
    assert not at.exception
    table = at.dataframe[0].value
    assert set(table["i"]) <= {2} and (table["inequality"] == "1b").all() and not table["holds"].any()


def test_presets_show_the_two_ways_the_criteria_disagree():
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    at.button(key="d1_preset_Identical models").click().run()
    check_page(at, "cosine", "old")
    shown = metrics(at)
    assert shown["Definition 1 (all pairs)"] == "holds" and shown["ECC: cross-test > self-test"] == "fails"

    at.slider(key="d1_classes").set_value(2)  # fewer images: a focused image that no longer exists is reset
    at.selectbox(key="d1_focus").set_value("image 30")
    at.run()
    assert not at.exception and at.selectbox(key="d1_focus").value == "every image"

    at.button(key="d1_preset_The new model drifts").click().run()
    check_page(at, "cosine", "old")
    assert metrics(at)["ECC: cross-test > self-test"] == "fails"
