"""The statistics check-upgrade's rule needs (issue 37), each against an independent numpy/scipy computation: query
groups (a cluster bootstrap) on every path, the two-way interval re-centred on single-relevant data, the anytime-valid
interval of --sequential, and simultaneous (max-T) intervals for the plan's choice among adapters."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy.stats import binom, norm
from scipy.stats import t as student_t

from engine.cli import main
from engine.metrics.cell_interval import paired_intervals
from engine.metrics.compatibility import CellFeatures
from engine.metrics.paired import cluster_variance, paired_bootstrap
from engine.metrics.selection import joint_means, simultaneous_level
from engine.metrics.sequential import confidence_sequence
from engine.metrics.twoway import _counts, resampled_hits, top_lists, twoway_bootstraps
from engine.upgrade.verdict import check_upgrade


# ---------------------------------------------------------------------------------------------- query groups


def _grouped_outcomes(seed: int = 5, n: int = 300):
    rng = np.random.default_rng(seed)
    groups = np.array([f"topic-{g}" for g in rng.integers(0, 37, n)])
    a, b = rng.integers(0, 2, n).astype(float), rng.integers(0, 2, n).astype(float)
    a[rng.choice(n, 20, replace=False)] = np.nan  # queries without a positive: left out, their groups shrink
    return a, b, groups


def test_the_grouped_interval_is_numpys_random_halves_of_the_groups_with_the_same_draws():
    a, b, groups = _grouped_outcomes()
    d = a - b
    keep = ~np.isnan(d)
    names, g = np.unique(groups[keep], return_inverse=True)
    sums, sizes = np.bincount(g, weights=d[keep]), np.bincount(g)
    half = np.random.default_rng((3, 1, 0)).integers(0, 2, size=(800, len(names)))  # one call: the same stream
    means = np.sort(half @ sums / (half @ sizes))  # 37 groups: no empty half in 800 draws
    k = 40  # floor(0.05 * 801): the Monte Carlo sign-flip test's rank at 90 %
    want = (d[keep].mean(), means[k - 1], means[800 - k])
    got = paired_bootstrap(a, b, resamples=800, seed=(3, 1, 0), confidence=0.9, groups=groups)
    assert got == pytest.approx(want, abs=1e-12)
    (cell,) = paired_intervals(b, [a], seed=(3, 1, 0), resamples=800, confidence=0.9, groups=groups)
    assert (cell.diff, cell.lo, cell.hi) == pytest.approx(want, abs=1e-12) and cell.interval == "queries"
    single = paired_bootstrap(a, b, resamples=800, seed=(3, 1, 0), confidence=0.9)
    assert single != got  # single queries are another bootstrap


def test_the_grouped_interval_inverts_the_sign_flip_test_enumerated_on_a_grid():
    """7 groups of unequal sizes: every one of the 2^7 sign vectors of the residuals ``S_g - mu N_g`` at each mu of a
    fine grid (no shortcut through subset means); the interval is the mu no side rejects. The level puts a/2 halfway
    between two p-values (12.5 / 128), so 200,000 Monte Carlo draws land on the enumeration's answer."""
    rng = np.random.default_rng(8)
    sizes = np.array([3, 1, 4, 2, 5, 2, 3])
    groups = np.repeat(np.arange(7), sizes)
    d = rng.normal(size=len(groups)) * 0.2 + np.repeat(rng.normal(size=7) * 0.3, sizes)
    S = np.bincount(groups, weights=d)
    level = 1 - 25 / 128
    signs = np.array(np.meshgrid(*[[-1.0, 1.0]] * 7)).reshape(7, -1).T  # (128, 7), the identity among them
    grid = np.linspace(d.min(), d.max(), 200_001)
    r = S[None, :] - grid[:, None] * sizes[None, :]  # (grid, 7)
    flipped, observed = r @ signs.T, r.sum(1, keepdims=True)
    p_low = np.mean(flipped >= observed - 1e-12, axis=1)  # small when mu is too low
    p_high = np.mean(flipped <= observed + 1e-12, axis=1)
    alpha = (1 - level) / 2
    kept = grid[(p_low > alpha) & (p_high > alpha)]
    diff, lo, hi = paired_bootstrap(d, np.zeros_like(d), resamples=200_000, seed=4, confidence=level, groups=groups)
    step = grid[1] - grid[0]
    assert diff == pytest.approx(S.sum() / sizes.sum(), abs=1e-12)
    assert lo == pytest.approx(kept.min(), abs=1.5 * step) and hi == pytest.approx(kept.max(), abs=1.5 * step)
    assert kept.max() - kept.min() == pytest.approx(len(kept) * step, rel=1e-3)  # one interval, no holes


def test_too_few_groups_or_resamples_for_the_level_give_the_whole_range():
    rng = np.random.default_rng(2)
    d = rng.normal(size=40) * 0.1
    for n_groups, resamples in ((1, 1000), (4, 1000), (12, 10)):  # 2^-4 > 2.5 %; floor(0.025 * 11) = 0
        got = paired_bootstrap(d, np.zeros(40), resamples=resamples, groups=np.arange(40) % n_groups)
        assert got == (pytest.approx(d.mean(), abs=1e-12), -1.0, 1.0)
    means = np.bincount(np.arange(40) % 6, weights=d) / np.bincount(np.arange(40) % 6)
    _, lo, hi = paired_bootstrap(d, np.zeros(40), resamples=20_000, groups=np.arange(40) % 6)  # 2^-6 < 2.5 %
    assert means.min() <= lo < d.mean() < hi <= means.max()


def test_cluster_variance_by_hand():
    d = np.array([1.0, 0, 0, -1, 1, 1, 0, 0])
    assert cluster_variance(d) == pytest.approx(d.var(ddof=1) / 8, abs=1e-15)
    assert cluster_variance(d, np.arange(8)) == pytest.approx(d.var(ddof=1) / 8, abs=1e-15)  # singletons: the same
    g = np.array([0, 0, 1, 1, 1, 2, 2, 2])
    sums, sizes, mean = np.array([1.0, 0, 1]), np.array([2, 3, 3]), d.mean()
    assert cluster_variance(d, g) == pytest.approx(3 / 2 * np.sum((sums - mean * sizes) ** 2) / 64, abs=1e-15)


def _cells(seed: int = 3, n: int = 240, copies: int = 1):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(8, 6))
    gl, ql = rng.integers(0, 8, 300), rng.integers(0, 8, n)
    g, q = centers[gl] + rng.normal(size=(300, 6)), centers[ql] + rng.normal(size=(n, 6))
    q_new = q + 0.8 * rng.normal(size=q.shape)
    return (np.repeat(q, copies, 0), np.repeat(ql, copies), g, gl, np.repeat(q_new, copies, 0),
            np.repeat(np.arange(n), copies))


def test_the_two_way_bootstrap_resamples_groups_of_queries():
    q, ql, g, gl, q_new, _ = _cells()
    old, new = top_lists(q, ql, g, gl, depth=20), top_lists(q_new, ql, g, gl, depth=20)
    [plain] = twoway_bootstraps(old, [new], resamples=300, seed=1)
    [singletons] = twoway_bootstraps(old, [new], resamples=300, seed=1, groups=np.arange(len(q)) * 7)
    centre = np.mean(resampled_hits(new, np.ones((1, 300), np.int32))[0].astype(float)
                     - resampled_hits(old, np.ones((1, 300), np.int32))[0])
    t_ratio = student_t.ppf(0.975, len(q) - 1) / norm.ppf(0.975)  # 240 groups of one: t(239) ends, the same draws
    assert singletons == pytest.approx(tuple(centre + (np.array(plain) - centre) * t_ratio), abs=1e-6)
    # every query written five times: as single queries the copies look independent (about sqrt(5) too narrow);
    # as groups they count once, as the queries did before they were copied
    q5, ql5, _, _, q_new5, groups5 = _cells(copies=5)
    old5, new5 = top_lists(q5, ql5, g, gl, depth=20), top_lists(q_new5, ql5, g, gl, depth=20)
    spread = {"resamples": 300, "seed": 1, "centring": "observed"}  # widths alone (no union of two locations)
    [(lo, hi)] = twoway_bootstraps(old5, [new5], **spread)
    [(glo, ghi)] = twoway_bootstraps(old5, [new5], groups=groups5, **spread)
    [(plo, phi)] = twoway_bootstraps(old, [new], **spread)
    assert (ghi - glo) > 1.5 * (hi - lo) and (ghi - glo) == pytest.approx(phi - plo, rel=0.35)


# ---------------------------------------------------------------------------------------------- single relevant item


def _single_relevant(seed: int, n_q: int = 1000, n_g: int = 5000, spread: float = 0.3):
    """One relevant gallery item per query (its partner), the rest distractors; the new model is the old features
    turned by 90 degrees in every plane of a random basis (an exact rotation: new/new equals old/old, new/old loses
    nearly every hit)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n_g, 16))
    q = x[:n_q] + spread * rng.normal(size=(n_q, 16)) + 0.6 * rng.normal(size=(n_q, 16))
    g = x + 0.6 * rng.normal(size=x.shape)
    basis, _ = np.linalg.qr(rng.normal(size=(16, 16)))
    turn = np.kron(np.eye(8), np.array([[0.0, -1.0], [1.0, 0.0]]))
    rot = basis @ turn @ basis.T
    return CellFeatures(q, np.arange(n_q), g, np.arange(n_g)), CellFeatures(q @ rot, np.arange(n_q), g @ rot, np.arange(n_g))


def test_a_gallery_resample_inflates_single_relevant_recall_and_the_interval_keeps_its_point():
    old, new = _single_relevant(0)
    lists = top_lists(old.query, old.query_labels, old.gallery, old.gallery_labels, depth=20)
    counts = _counts(np.random.default_rng(2), 200, len(old.gallery))
    hits = resampled_hits(lists, counts)
    there = counts[:, old.query_labels] > 0  # the query's only relevant item was drawn
    inside = np.mean(hits.sum(1) / there.sum(1))
    observed = np.mean(resampled_hits(lists, np.ones((1, len(old.gallery)), np.int32)))
    assert inside > observed + 0.02  # near-misses turn into hits when their distractor is not drawn (0.33 -> 0.38)
    outside_before = 0
    for seed in range(4):
        old, new = _single_relevant(seed)
        oo = top_lists(old.query, old.query_labels, old.gallery, old.gallery_labels, depth=20)
        no = top_lists(new.query, new.query_labels, old.gallery, old.gallery_labels, depth=20)
        point = np.mean(resampled_hits(no, np.ones((1, 5000), np.int32))[0].astype(float)
                        - resampled_hits(oo, np.ones((1, 5000), np.int32))[0])
        [(lo, hi)] = twoway_bootstraps(oo, [no], resamples=300, seed=seed)  # the default: the union of both
        [(blo, bhi)] = twoway_bootstraps(oo, [no], resamples=300, seed=seed, centring="replicates")
        [(olo, ohi)] = twoway_bootstraps(oo, [no], resamples=300, seed=seed, centring="observed")
        assert olo <= point <= ohi and ohi - olo == pytest.approx(bhi - blo, rel=1e-9)  # the same spread, moved
        assert (lo, hi) == (min(olo, blo), max(ohi, bhi)) and lo <= point <= hi
        outside_before += not blo <= point <= bhi
    assert outside_before >= 1  # the interval about the replicates' own centre left out its point


# ---------------------------------------------------------------------------------------------- sequential


def _cs_by_hand(d, level):
    """Waudby-Smith & Ramdas (2024), Theorem 2 (PrPl-EB), written as a plain loop over t with c = 1/2."""
    x = (np.asarray(d, float) + 1) / 2
    a = 1 - level
    mu_prev, s2_prev, s_x, s_sq = 0.5, 0.25, 0.0, 0.0
    num = den = pen = 0.0
    lo, hi = 0.0, 1.0
    for t, xt in enumerate(x, start=1):
        lam = min(math.sqrt(2 * math.log(2 / a) / (s2_prev * t * math.log(1 + t))), 0.5)
        v = 4 * (xt - mu_prev) ** 2
        num, den, pen = num + lam * xt, den + lam, pen + v * (-math.log(1 - lam) - lam) / 4
        lo, hi = max(lo, num / den - (math.log(2 / a) + pen) / den), min(hi, num / den + (math.log(2 / a) + pen) / den)
        s_x += xt
        mu = (0.5 + s_x) / (t + 1)
        s_sq += (xt - mu) ** 2
        mu_prev, s2_prev = mu, (0.25 + s_sq) / (t + 1)
    return 2 * lo - 1, 2 * hi - 1


def test_the_confidence_sequence_equals_the_papers_formula_by_hand():
    rng = np.random.default_rng(0)
    d = rng.choice([-1.0, 0.0, 1.0], p=[0.1, 0.75, 0.15], size=500)
    assert confidence_sequence(d, confidence=0.95) == pytest.approx(_cs_by_hand(d, 0.95), abs=1e-12)
    ap = rng.uniform(-1, 1, 120)  # AP differences: any value in [-1, 1]
    assert confidence_sequence(ap, confidence=0.9) == pytest.approx(_cs_by_hand(ap, 0.9), abs=1e-12)
    with pytest.raises(ValueError, match=r"values in \[-1, 1\]"):
        confidence_sequence(np.array([0.5, 2.0]), confidence=0.95)


def test_peeking_every_50_queries_keeps_the_sequential_false_pass_rate_but_not_the_fixed_one():
    """A true gap of 0; a team checks after every 50 queries up to 2,000 and ships at the first pass (lower end > 0)."""
    rng = np.random.default_rng(7)
    looks = np.arange(50, 2001, 50)
    streams = 200
    seq = fixed = 0
    for s in range(streams):
        d = rng.choice([-1.0, 0.0, 1.0], p=[0.1, 0.8, 0.1], size=2000)
        lo, _ = confidence_sequence(d, confidence=0.95, every=True)
        seq += bool(np.any(lo[looks - 1] > 0))
        fixed += any(paired_bootstrap(d[:n], np.zeros(n), resamples=500, seed=(s, n))[1] > 0 for n in looks)
    assert seq / streams <= 0.05 < fixed / streams  # measured: 0 % vs 19.5 % (39 of 200)


def test_check_upgrade_sequential_is_the_confidence_sequence_of_the_queries_in_order(tmp_path, capsys):
    q, ql, g, gl, q_new, groups = _cells()
    old, new = CellFeatures(q, ql, g, gl), CellFeatures(q_new, ql, g, gl)
    report = check_upgrade(old, new, metric="map", orderings=(), interval="sequential")
    from engine.upgrade.verdict import per_query_scores

    d = per_query_scores(q_new, ql, g, gl, metric="map") - per_query_scores(q, ql, g, gl, metric="map")
    c = report.compatibility
    assert (c.lo, c.hi) == pytest.approx(confidence_sequence(d, confidence=0.95), abs=1e-12)
    assert report.interval == "sequential" and report.to_json()["bootstrap"]["method"].startswith("confidence sequence")
    assert any("valid at every number of queries" in n for n in report.notes)
    wide = check_upgrade(old, new, metric="map", orderings=(), interval="queries").compatibility
    assert c.hi - c.lo > wide.hi - wide.lo
    with pytest.raises(ValueError, match="does not go with query groups"):
        check_upgrade(old, new, orderings=(), interval="sequential", query_groups=groups)


# ---------------------------------------------------------------------------------------------- selection


def test_joint_means_draw_the_same_queries_for_every_candidate():
    rng = np.random.default_rng(1)
    d = rng.normal(size=(3, 50))
    d[1, 4] = np.nan
    got = joint_means(list(d), resamples=40, seed=9)
    counts = np.random.default_rng(9).multinomial(50, np.full(50, 1 / 50), size=40)
    for i in range(3):
        valid = ~np.isnan(d[i])
        want = (counts[:, valid] @ d[i][valid]) / counts[:, valid].sum(1)
        np.testing.assert_allclose(got[:, i], want, atol=1e-12)


def test_the_chosen_adapters_interval_covers_at_its_level_under_equal_adapters():
    """Eight adapters of equal worth (true gap 0 each, correlated through the queries); the plan ships the one with
    the highest lower end. Simultaneous intervals keep that interval's coverage at 95 %; single ones do not."""
    rng = np.random.default_rng(11)
    m, n, reps = 8, 150, 300
    covered = {"simultaneous": 0, "single": 0}
    for r in range(reps):
        shared = rng.normal(size=n)
        diffs = [np.clip(np.round(0.4 * shared + 0.9 * rng.normal(size=n)), -1, 1) for _ in range(m)]  # hit flips
        level = simultaneous_level(diffs, level=0.95, resamples=1000, seed=(r, 1, 0))
        assert 0.95 < level <= 1 - 0.05 / m
        for key, lev in (("simultaneous", level), ("single", 0.95)):
            intervals = [paired_bootstrap(x, np.zeros(n), resamples=1000, seed=(r, 1, 0), confidence=lev) for x in diffs]
            _, lo, hi = max(intervals, key=lambda t: t[1])
            covered[key] += lo <= 0 <= hi
    k = covered["simultaneous"]
    assert binom.cdf(k, reps, 0.95) > 0.005, covered  # consistent with >= 95 %
    assert covered["single"] < k and binom.cdf(covered["single"], reps, 0.95) < 0.005, covered  # the winner's curse


def test_one_candidate_keeps_the_level():
    assert simultaneous_level([np.zeros(10) + 0.1], level=0.9, resamples=100, seed=0) == 0.9


# ---------------------------------------------------------------------------------------------- --query-groups


@pytest.fixture()
def grouped_folder(tmp_path, monkeypatch):
    """A --features folder whose 300 queries come in 30 topics of 10 (a query_groups array in step_1.npz) and the same
    groups as a .txt and a .npy file."""
    monkeypatch.setenv("COMPATLAB_DATA_ROOTS", str(tmp_path))
    rng = np.random.default_rng(0)
    topics, size = 30, 10
    centres = 2 * rng.normal(size=(10, 8))
    t_class = rng.integers(0, 10, topics)
    ql = np.repeat(t_class, size)
    gl = rng.integers(0, 10, 300)
    g = centres[gl] + rng.normal(size=(300, 8))
    base = centres[ql] + 0.8 * np.repeat(rng.normal(size=(topics, 8)), size, 0)
    q_old = base + 0.7 * np.repeat(rng.normal(size=(topics, 8)), size, 0) + 0.1 * rng.normal(size=(300, 8))
    q_new = base + 0.7 * np.repeat(rng.normal(size=(topics, 8)), size, 0) + 0.1 * rng.normal(size=(300, 8))
    groups = np.repeat(np.arange(topics), size)
    folder = tmp_path / "f"
    folder.mkdir()
    np.savez(folder / "step_1.npz", query_features=q_old, query_labels=ql, gallery_features=g, gallery_labels=gl,
             query_groups=groups)
    np.savez(folder / "step_2.npz", query_features=q_new, query_labels=ql, gallery_features=g, gallery_labels=gl)
    (tmp_path / "groups.txt").write_text("\n".join(f"topic {t:02d}" for t in groups) + "\n")  # sorted as the numbers
    np.save(tmp_path / "groups.npy", groups)
    return folder, groups, CellFeatures(q_old, ql, g, gl), CellFeatures(q_new, ql, g, gl)


def test_query_groups_from_the_npz_or_a_file_give_the_cluster_bootstrap(tmp_path, capsys, grouped_folder):
    folder, groups, old, new = grouped_folder
    want = check_upgrade(old, new, metric="map", orderings=(), query_groups=groups)
    plain = check_upgrade(old, new, metric="map", orderings=(), resamples=1000)
    assert want.query_groups == 30 and want.to_json()["bootstrap"]["paired_over"] == "30 query groups"
    assert (want.compatibility.hi - want.compatibility.lo) > 1.5 * (plain.compatibility.hi - plain.compatibility.lo)
    for arg in ("query_groups", str(tmp_path / "groups.txt"), str(tmp_path / "groups.npy")):
        out = tmp_path / f"r{len(arg)}.json"
        main(["check-upgrade", "--features", str(folder), "--adapters", "--query-groups", arg, "--json", str(out)])
        got = json.loads(out.read_text())
        assert got["query_groups"] == 30 and got["compatibility"]["lo"] == pytest.approx(want.compatibility.lo, abs=1e-12)
        assert "in 30 groups" in got["sentence"]
    assert "paired percentile bootstrap over 30 query groups" in capsys.readouterr().out


@pytest.mark.parametrize("make, args, message", [
    (lambda p: (p / "short.txt").write_text("a\nb\n"), ["--query-groups", "{}/short.txt"],
     "one group per query: 300 queries, 2 groups given"),
    (lambda p: (p / "gap.txt").write_text("a\n\nb\n"), ["--query-groups", "{}/gap.txt"], "line 2 is empty"),
    (lambda p: None, ["--query-groups", "topic"], "give a file ending in .npy or .txt, or query_groups"),
    (lambda p: None, ["--query-groups", "query_groups", "--sequential"], "leave out --query-groups"),
    (lambda p: np.save(p / "two.npy", np.zeros((300, 2))), ["--query-groups", "{}/two.npy"], "1-D array"),
])
def test_bad_query_groups_are_one_line_exit_2(tmp_path, capsys, grouped_folder, make, args, message):
    folder = grouped_folder[0]
    make(tmp_path)
    assert main(["check-upgrade", "--features", str(folder), *[a.format(tmp_path) for a in args]]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and message in err, err


def test_query_groups_outside_the_data_roots_are_refused(tmp_path, capsys, grouped_folder, monkeypatch):
    folder = grouped_folder[0]
    monkeypatch.setenv("COMPATLAB_DATA_ROOTS", str(folder))
    assert main(["check-upgrade", "--features", str(folder), "--query-groups", str(tmp_path / "groups.txt")]) == 2
    assert "outside the data roots" in capsys.readouterr().err


def test_the_store_path_reads_the_groups_from_a_column_and_agrees_with_memory(tmp_path, grouped_folder):
    from engine.upgrade.from_sources import SourceSpecs, check_sources

    _, groups, old, new = grouped_folder
    texts = {}
    for side, cell, what in (("old_gallery", old, "gallery"), ("new_gallery", new, "gallery"),
                             ("old_queries", old, "query"), ("new_queries", new, "query")):
        extra = {"topic": np.array([f"t{t:02d}" for t in groups])} if what == "query" else {}  # sorted as the numbers
        np.savez(tmp_path / f"{side}.npz", ids=np.arange(len(getattr(cell, what))), vectors=getattr(cell, what),
                 labels=getattr(cell, f"{what}_labels"), **extra)
        texts[side] = str(tmp_path / f"{side}.npz")
    specs = SourceSpecs(texts["old_gallery"], texts["old_queries"], texts["new_queries"], texts["new_gallery"])
    for interval in ("queries", "two-way"):
        got = check_sources(specs, metric="recall@1", interval=interval, query_groups="topic").report
        want = check_upgrade(old, new, metric="recall@1", orderings=(), interval=interval, query_groups=groups)
        assert got.query_groups == want.query_groups == 30 and got.interval == want.interval == interval
        for a, b in ((got.compatibility, want.compatibility), (got.better, want.better)):
            assert (a.diff, a.lo, a.hi) == pytest.approx((b.diff, b.lo, b.hi), abs=1e-9)
            assert a.needed == b.needed


def test_the_sequential_option_on_the_command_line(tmp_path, capsys, grouped_folder):
    folder = grouped_folder[0]
    out = tmp_path / "seq.json"
    code = main(["check-upgrade", "--features", str(folder), "--adapters", "--sequential", "--json", str(out)])
    report = json.loads(out.read_text())
    assert code == {"compatible": 0, "not compatible": 1, "too close to call": 3}[report["verdict"]]
    assert report["interval"] == "sequential" and report["bootstrap"]["paired_over"] == "queries in the order given"
    assert "(anytime-valid confidence sequence over queries in the order given, level 0.95)" in capsys.readouterr().out
    assert main(["check-upgrade", "--features", str(folder), "--sequential", "--interval", "queries"]) == 2
    assert "leave out --interval" in capsys.readouterr().err


def test_the_few_groups_quantile_is_scipys_and_agrees_with_the_series_it_replaced():
    """Student's t now comes from scipy; the Cornish-Fisher series (Abramowitz & Stegun 26.7.5) it replaces is written
    here as the reference: 0.75 % low at 2 groups - 1 and within 4e-6 from df = 10, so intervals over 11 or more
    groups move by less than a millionth of their width."""
    from statistics import NormalDist

    from scipy.stats import t

    from engine.metrics.paired import few_groups_factor, student_quantile

    def series(p, df):
        z = NormalDist().inv_cdf(p)
        g = ((z ** 3 + z) / 4, (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96,
             (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384,
             (79 * z ** 9 + 776 * z ** 7 + 1482 * z ** 5 - 1920 * z ** 3 - 945 * z) / 92160)
        return z + sum(c / df ** (i + 1) for i, c in enumerate(g))

    for df in (2, 3, 5, 10, 19, 50):
        assert student_quantile(0.975, df) == pytest.approx(t.ppf(0.975, df), rel=1e-12)
        assert series(0.975, df) == pytest.approx(student_quantile(0.975, df), rel=0.008 if df < 10 else 4e-6)
    assert few_groups_factor(20, 0.95) == pytest.approx(t.ppf(0.975, 19) / NormalDist().inv_cdf(0.975), rel=1e-12)
    assert few_groups_factor(1, 0.95) == 1.0
