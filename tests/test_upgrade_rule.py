"""check-upgrade's rule (strict ECC / ties passing / non-inferiority margin), the queries a too-close call needs,
and the two-way bootstrap's resampled ranks, on hand-made cases."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import norm

from engine.cli import main
from engine.metrics.compatibility import CellFeatures
from engine.metrics.twoway import resampled_hits, top_lists, twoway_bootstraps
from engine.upgrade.rule import Rule, decide, queries_needed
from engine.upgrade.verdict import check_upgrade

STRICT, TIES, MARGIN = Rule(), Rule(ties="pass"), Rule(margin=0.5)


@pytest.mark.parametrize("diff, lo, hi, rule, expected", [
    (0.02, 0.01, 0.03, STRICT, ("pass", False)),
    (0.0, 0.0, 0.0, STRICT, ("unresolved", True)),  # an unchanged model: a tie, not a fail
    (0.0, 0.0, 0.0, TIES, ("pass", True)),
    (0.0, 0.0, 0.0, MARGIN, ("pass", False)),
    (-0.003, -0.006, 0.0, STRICT, ("unresolved", False)),  # ends on 0: a population gap just above 0 is not excluded
    (-0.02, -0.03, -0.01, STRICT, ("fail", False)),
    (-0.02, -0.03, -0.01, TIES, ("fail", False)),
    (0.001, -0.004, 0.006, STRICT, ("unresolved", False)),
    (0.001, -0.004, 0.006, MARGIN, ("pass", False)),  # lower end -0.4 points > -0.5 points
    (-0.001, -0.006, 0.004, MARGIN, ("unresolved", False)),  # lower end -0.6 points
    (-0.02, -0.03, -0.01, MARGIN, ("fail", False)),  # the whole interval below -0.5 points
    (0.0, -0.0, 0.01, TIES, ("pass", False)),  # >= with ties passing
    (0.0, -0.0, 0.01, STRICT, ("unresolved", False)),  # the point does not pass strict ECC
])
def test_decide(diff, lo, hi, rule, expected):
    assert decide(diff, lo, hi, rule) == expected


def test_rule_names_and_bad_rules():
    assert STRICT.name == "strict ECC (cross-test > self-test, the papers' rule)"
    assert TIES.name == "ECC with ties passing (cross-test >= self-test)"
    assert MARGIN.name == "non-inferiority margin 0.5 points (cross-test > self-test - 0.5 points)"
    assert MARGIN.threshold == pytest.approx(-0.005)
    for kwargs, message in [({"margin": -1}, "margin"), ({"margin": 100}, "margin"), ({"margin": float("nan")}, "margin"),
                            ({"ties": "maybe"}, "tie rule")]:
        with pytest.raises(ValueError, match=message):
            Rule(**kwargs)


def test_queries_needed_by_hand():
    # six +1, ... : d = 1,0,0,-1,1,1,0,0,0,0: mean 0.2, sum of squared deviations 3.6, sample variance 0.4
    d = np.array([1, 0, 0, -1, 1, 1, 0, 0, 0, 0, np.nan])
    z95, z90, z80 = norm.ppf(0.975), norm.ppf(0.95), norm.ppf(0.80)  # two-sided level, 80 % power
    assert queries_needed(d, level=0.95) == math.ceil((z95 + z80) ** 2 * 0.4 / 0.2 ** 2) == 79  # 78.5
    assert queries_needed(d, level=0.90) == math.ceil((z90 + z80) ** 2 * 0.4 / 0.2 ** 2) == 62  # 61.8
    assert queries_needed(d, level=0.95, rule=MARGIN) == math.ceil((z95 + z80) ** 2 * 0.4 / 0.205 ** 2) == 75  # 74.7
    assert queries_needed(d, level=0.95, power=0.5) == math.ceil(z95 ** 2 * 0.4 / 0.2 ** 2) == 39  # the coin flip
    assert queries_needed(np.array([1.0, -1.0, 0.0]), level=0.95) is None  # mean exactly 0: no number of queries
    assert queries_needed(np.zeros(5), level=0.95) is None
    assert queries_needed(np.full(4, -0.005), level=0.95, rule=MARGIN) is None  # on the margin's threshold
    with pytest.raises(ValueError, match="no paired difference"):
        queries_needed(np.array([np.nan]), level=0.95)


def test_queries_needed_is_never_below_the_queries_that_did_not_decide():
    d = np.r_[np.ones(60), -np.ones(40), np.zeros(900)]  # mean 0.02, sd ~0.316: the formula asks for ~1,960
    assert queries_needed(d, level=0.95) == math.ceil((norm.ppf(0.975) + norm.ppf(0.8)) ** 2 * d.var(ddof=1) / 0.02 ** 2)
    # 20 gains, 2 losses in 5,000: the formula asks for about 2,700; a two-way call (gallery noise too) can stay
    # undecided at 5,000, and then the answer is at least one more query than were used
    big = np.r_[np.ones(20), -np.ones(2), np.zeros(4978)]
    assert (norm.ppf(0.975) + norm.ppf(0.8)) ** 2 * big.var(ddof=1) / big.mean() ** 2 < len(big)
    assert queries_needed(big, level=0.95) == len(big) + 1
    assert queries_needed(np.zeros(3000), level=0.95, rule=MARGIN) == 3001  # 736 unchanged queries, but 3,000 did not


def test_queries_needed_with_groups_uses_the_groups_variance():
    rng = np.random.default_rng(0)
    topic = rng.choice([-1.0, 0.0, 1.0], p=[0.3, 0.35, 0.35], size=30)
    d = np.repeat(topic, 10)  # ten paraphrases per topic change together
    groups = np.repeat(np.arange(30), 10)
    sums = topic * 10
    v = 30 / 29 * np.sum((sums - d.mean() * 10) ** 2) / 300 ** 2  # cluster-robust variance of the mean, by hand
    z = norm.ppf(0.975) + norm.ppf(0.8)
    assert queries_needed(d, level=0.95, groups=groups) == max(301, math.ceil(z ** 2 * 300 * v / d.mean() ** 2))
    assert queries_needed(d, level=0.95, groups=groups) > 5 * queries_needed(d, level=0.95)  # ~10x: one topic, one vote


# ---------------------------------------------------------------------------------------------- two-way bootstrap


def _hits_by_hand(q, ql, g, gl, counts, k, same_set):
    """Hit@k of each query on the gallery holding item j counts[j] times, built explicitly (pessimistic ties)."""
    out = np.zeros(len(q), bool)
    for i in range(len(q)):
        keep = counts.copy()
        if same_set:
            keep[i] = 0  # the query's own image, all its copies
        items = np.repeat(np.arange(len(g)), keep)
        sims = (q[i] / np.linalg.norm(q[i])) @ (g[items] / np.linalg.norm(g[items], axis=1, keepdims=True)).T
        pos = gl[items] == ql[i]
        if pos.any():
            out[i] = np.sum(~pos & (sims >= sims[pos].max())) < k
    return out


@pytest.mark.parametrize("k, same_set, depth", [(1, False, 12), (3, False, 16), (1, True, 12), (2, False, 2)])
def test_resampled_hits_equal_a_gallery_built_by_hand(k, same_set, depth):
    rng = np.random.default_rng(k + depth)
    g = rng.normal(size=(40, 4)).astype(np.float32)
    gl = rng.integers(0, 5, size=40)
    q, ql = (g, gl) if same_set else (rng.normal(size=(25, 4)).astype(np.float32), rng.integers(0, 6, size=25))
    lists = top_lists(q, ql, g, gl, depth=depth, same_set=same_set)  # depth 2: most queries ranked in full
    counts = rng.multinomial(40, np.full(40, 1 / 40), size=6).astype(np.int32)
    got = resampled_hits(lists, counts, k=k)
    for r in range(len(counts)):
        assert got[r].tolist() == _hits_by_hand(q, ql, g, gl, counts[r], k, same_set).tolist()


def test_twoway_interval_of_identical_cells_is_the_point_zero_and_wider_than_queries_only():
    rng = np.random.default_rng(3)
    centers = rng.normal(size=(8, 6))
    gl, ql = rng.integers(0, 8, 300), rng.integers(0, 8, 300)
    g, q = centers[gl] + rng.normal(size=(300, 6)), centers[ql] + rng.normal(size=(300, 6))
    old = top_lists(q, ql, g, gl, depth=20)
    new = top_lists(q + 0.8 * rng.normal(size=q.shape), ql, g, gl, depth=20)
    [(lo0, hi0), (lo, hi)] = twoway_bootstraps(old, [old, new], resamples=300, seed=1)
    assert (lo0, hi0) == (0.0, 0.0)
    [(plo, phi)] = twoway_bootstraps(old, [new], resamples=300, seed=1, corrected=False)
    assert plo < lo < hi < phi  # the correction removes the double-counted interaction: narrower than the pigeonhole
    report = check_upgrade(CellFeatures(q, ql, g, gl), CellFeatures(q + 0.8 * rng.normal(size=q.shape), ql, g, gl),
                           orderings=(), resamples=300)
    assert report.interval == "two-way" and report.to_json()["bootstrap"]["paired_over"] == "queries and gallery items"
    assert check_upgrade(CellFeatures(q, ql, g, gl), CellFeatures(q, ql, g, gl), metric="map",
                         orderings=()).notes == ("the gallery resample covers recall@k; this map interval resamples queries only",)


# ---------------------------------------------------------------------------------------------- check-upgrade CLI


def flip_pair(gains: int, losses: int, same: int) -> tuple[CellFeatures, CellFeatures]:
    """Two classes, one gallery item each: ``gains`` queries only new hits, ``losses`` only old, ``same`` both."""
    e = np.eye(2)
    n = gains + losses + same
    labels = np.tile([0, 1], n)[:n]
    own, other = e[labels], e[1 - labels]
    old_hit = np.r_[np.zeros(gains), np.ones(losses + same)].astype(bool)[:, None]
    new_hit = np.r_[np.ones(gains), np.zeros(losses), np.ones(same)].astype(bool)[:, None]
    return (CellFeatures(np.where(old_hit, own, other), labels, e, np.array([0, 1])),
            CellFeatures(np.where(new_hit, own, other), labels, e, np.array([0, 1])))


def _write(path, old, new):
    path.mkdir()
    for i, s in enumerate((old, new), 1):
        np.savez(path / f"step_{i}.npz", query_features=s.query, query_labels=s.query_labels,
                 gallery_features=s.gallery, gallery_labels=s.gallery_labels)
    return path


@pytest.mark.parametrize("args, code, verdict", [([], 3, "too close to call"), (["--margin", "0.5"], 0, "compatible"),
                                                 (["--ties", "pass"], 0, "compatible")])
def test_an_identical_model_is_a_tie_under_strict_ecc_and_passes_with_a_margin_or_ties(tmp_path, capsys, args, code, verdict):
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), 20)
    same = CellFeatures(rng.normal(size=(200, 8)) + 2 * np.eye(10, 8)[labels], labels, rng.normal(size=(200, 8)), labels)
    folder = _write(tmp_path / "f", same, same)
    out = tmp_path / "r.json"
    assert main(["check-upgrade", "--features", str(folder), "--json", str(out), *args]) == code
    report = json.loads(out.read_text())
    c = report["compatibility"]
    assert report["verdict"] == verdict and c["diff"] == c["lo"] == c["hi"] == 0
    printed = capsys.readouterr().out
    if not args:
        assert c["tie"] is True and c["needed"] is None and report["rule"].startswith("strict ECC")
        assert "a tie, which the papers' strict ECC" in report["sentence"]
        assert "rule: strict ECC (cross-test > self-test, the papers' rule)" in printed
        assert "queries needed: no number of queries would decide it" in printed
    else:
        assert "queries needed" not in printed and f"Rule: {report['rule']}." in report["sentence"]
        assert report["margin"] == (0.5 if "--margin" in args else 0) and report["ties"] == ("pass" if "--ties" in args else "fail")


def test_a_too_close_call_prints_the_queries_that_would_decide_it(tmp_path, capsys):
    old, new = flip_pair(gains=6, losses=4, same=10)  # d: six +1, four -1, ten 0: mean 0.1, sample variance 9.8 / 19
    folder = _write(tmp_path / "f", old, new)
    out = tmp_path / "r.json"
    assert main(["check-upgrade", "--features", str(folder), "--json", str(out)]) == 3
    needed = math.ceil((norm.ppf(0.975) + norm.ppf(0.8)) ** 2 * (9.8 / 19) / 0.1 ** 2)  # 80 % power
    assert needed == 405 and json.loads(out.read_text())["compatibility"]["needed"] == needed
    printed = capsys.readouterr().out
    assert f"queries needed: about {needed:,} queries (20 now) would decide it with 80 % power, a one-look" in printed
    assert f"plan note: {needed:,} queries would decide whether new is better on its own" in printed  # the same d


@pytest.mark.parametrize("args, message", [(["--margin", "-1"], "margin"), (["--margin", "100"], "margin"),
                                           (["--interval", "gallery"], "invalid choice"), (["--ties", "x"], "invalid choice")])
def test_bad_rules_are_refused(tmp_path, capsys, args, message):
    folder = _write(tmp_path / "f", *flip_pair(1, 1, 2))
    code = None
    try:
        code = main(["check-upgrade", "--features", str(folder), *args])
    except SystemExit as exc:  # argparse's own choices
        code = exc.code
    assert code == 2 and message in capsys.readouterr().err


def test_no_query_changes_but_the_features_differ_gives_the_exact_zero_change_bound():
    """A float16 copy: no sampled query flips, yet the population may; the interval is +/- 1 - 0.025^(1/n)."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), 20)
    centers = 3 * np.eye(10, 8)[labels]
    old = CellFeatures(rng.normal(size=(200, 8)) + centers, labels, rng.normal(size=(200, 8)) + centers, labels)
    half = lambda x: x.astype(np.float16).astype(np.float64)  # noqa: E731
    new = CellFeatures(half(old.query), labels, half(old.gallery), labels)
    report = check_upgrade(old, new, orderings=())
    c, r = report.compatibility, 1 - 0.025 ** (1 / 200)
    assert c.diff == 0 and (c.lo, c.hi) == pytest.approx((-r, r)) and r == pytest.approx(0.0183, abs=1e-4)
    assert c.verdict == "too close to call" and c.tie and c.needed is None  # strict ECC: every query ties
    assert "the exact bound on the share of queries that could change when none of 200 did" in report.notes[0]
    wide = check_upgrade(old, new, orderings=(), margin=0.5).compatibility
    assert wide.verdict == "too close to call"  # -1.8 points < -0.5: 200 unchanged queries do not show it
    assert wide.needed == math.ceil(math.log(0.025) / math.log(1 - 0.005)) == 736  # 736 unchanged queries would
    assert check_upgrade(old, new, orderings=(), margin=2).verdict == "compatible"


def test_a_float16_copy_passes_under_ties_pass_as_the_advice_says(tmp_path, capsys):
    """A float16 copy: no sampled query changes, every one is a tie. Strict ECC leaves it too close and its advice names
    --ties pass and a margin; --ties pass accepts it (equal scores pass, query by query), and so does the margin."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), 20)
    centers = 3 * np.eye(10, 8)[labels]
    old = CellFeatures(rng.normal(size=(200, 8)) + centers, labels, rng.normal(size=(200, 8)) + centers, labels)
    half = lambda x: x.astype(np.float16).astype(np.float64)  # noqa: E731
    folder = _write(tmp_path / "f", old, CellFeatures(half(old.query), labels, half(old.gallery), labels))
    base = ["check-upgrade", "--features", str(folder), "--metric", "recall@1"]
    r = 1 - 0.025 ** (1 / 200)  # the exact zero-change bound: 1.83 points
    m = math.floor(100 * r * 10 + 1) / 10  # the smallest margin (0.1 steps) whose threshold lies below -r: 1.9
    assert main(base) == 3
    printed = capsys.readouterr().out
    assert "(a tie); a margin (--margin) or --ties pass can accept it" in printed and m == 1.9
    assert main([*base, "--ties", "pass"]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("new is compatible with old") and "a tie, which ties passing accepts" in printed
    assert main([*base, "--margin", f"{m:g}"]) == 0
    assert main([*base, "--margin", "0.5"]) == 3  # -1.8 points < -0.5: 200 unchanged queries do not show it


def test_the_experiment_form_takes_the_rule_too(tmp_path, capsys):
    from support.upgrade_cli import store_pair

    url = f"sqlite:///{tmp_path / 'x.db'}"
    old, _ = flip_pair(gains=3, losses=3, same=14)
    exp = store_pair(url, old, old, names=("v1", "v2"))
    base = ["check-upgrade", "--experiment", str(exp), "--old-step", "1", "--new-step", "2", "--db", url]
    assert main(base) == 3 and "no number of queries would decide it" in capsys.readouterr().out
    assert main([*base, "--ties", "pass"]) == 0
    assert main([*base, "--margin", "0.5", "--interval", "queries"]) == 0
    assert "rule: non-inferiority margin 0.5 points" in capsys.readouterr().out
