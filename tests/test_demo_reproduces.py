"""The built-in demo (``python -m engine run --preset quick-demo``) on Fashion-MNIST, seeds 0, 1, 2: what it reproduces.

Asserted here, for the fixed seeds, are the papers' orderings the demo does reproduce (docs/results.md, "What reproduces"):

* paper 000 Tab. 1a baseline: independently trained encoders are not compatible; every Recall@1 cross-test fails the
  paired test, so AC = 0 for every seed;
* paper 000: PSP makes those same models more compatible; each PSP cross-test lies far above the encoder's (>= 15
  points) and PSP's mean AC over the seeds is above the encoders' (0). Not asserted: a mean AC of at least 0.5.
  Three seeds do not resolve it: with the arithmetic pinned (``compute_threads = 1``, the same numbers with any
  thread setting) this machine measured 0.67 / 0.33 / 0.67 (mean 0.56, 95 % t-interval over the seeds 0.08 to
  1.03); unpinned, 1 and 2 threads had trained different models (0.67 / 0.33 / 0.33 here, 0.67 +/- 0.33 elsewhere);
* paper 000: LSP is less compatible than PSP: PSP's mean Recall@1 margin is above LSP's, with a 95 % t-interval
  over the seeds above 0 (AC, 0.56 vs 0.11, is not resolved by three seeds, so it is not asserted);
* paper 000 Tab. 1a: CoReS under Recall@1 has AC = 0 for every seed.

Not asserted, because they do not reproduce at demo scale (docs/results.md gives the numbers and the likely causes):
LSP's higher AA, BCT's compatibility under Recall@1, and CoReS's AC = 1 under paper 002's pair verification.
The run takes about 3 minutes on an idle 2-core machine.
"""
import numpy as np
import pytest

from engine.cli import main
from engine.data.fashion_files import fashion_available
from storage import get_engine, load_matrices, session_scope
from storage.models import Experiment

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not fashion_available(), reason="Fashion-MNIST absent: apt-get install dataset-fashion-mnist")]
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """Run the demo once through the CLI: (printed text, {(method, view, metric, seed): (matrix, stored summary)})."""
    import contextlib
    import io

    tmp = tmp_path_factory.mktemp("demo")
    url = f"sqlite:///{tmp / 'demo.sqlite'}"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["run", "--preset", "quick-demo", "--quiet", "--db", url, "--checkpoints", str(tmp / "ckpt")]) == 0
    cells = {}
    with session_scope(get_engine(url)) as s:
        for exp in s.query(Experiment).all():
            for m in load_matrices(s, exp.id):
                cells[(exp.method, m.view, m.metric, exp.config["seed"])] = (np.array(m.values, dtype=np.float64), m.summary)
    return out.getvalue(), cells


def _cross(C: np.ndarray) -> np.ndarray:
    return C[np.tril_indices(len(C), -1)]


def test_the_printout_states_its_conventions_and_verdicts(demo):
    text, cells = demo
    assert {seed for (*_, seed) in cells} == set(SEEDS)
    for metric in ("recall@1", "verification"):
        assert f"{metric} | gallery instance | eval_classes seen | seeds 0, 1, 2 | init_seed: independent per_step" in text
    assert "cores same" in text  # paper 002's same initial seed for CoReS, a new seed per step for the others
    assert "paired test (95 % bootstrap interval over queries" in text and "paired test (95 % bootstrap interval over pairs" in text
    assert "mean ± std over 3 seeds" in text


def test_independent_encoders_are_not_compatible(demo):
    _, cells = demo
    for seed in SEEDS:
        C, summary = cells[("independent", "encoder", "recall@1", seed)]
        verdicts = [summary["paired"]["verdict"][t][k] for t in range(3) for k in range(t)]
        assert summary["AC"] == 0 and verdicts == ["fail"] * 3, seed


def test_psp_makes_the_same_independent_models_compatible(demo):
    _, cells = demo
    acs = []
    for seed in SEEDS:
        psp, summary = cells[("psp", "psp", "recall@1", seed)]
        encoder, _ = cells[("independent", "encoder", "recall@1", seed)]
        assert np.all(_cross(psp) >= _cross(encoder) + 0.15), seed
        acs.append(summary["AC"])
    assert np.mean(acs) > 0  # the encoders' AC is 0 on every seed (test_independent_encoders_are_not_compatible)


def test_lsp_is_less_compatible_than_psp(demo):
    """Resolved on the margins, not on AC: per seed, the mean Recall@1 margin (cross-test minus the gallery model's
    self-test, over the 3 cross-tests) of PSP minus LSP; its 95 % t-interval over the seeds lies above 0 (measured
    +3.9 points, +0.4 to +7.4). AC, their thresholded count, is not resolved by 3 seeds (0.56 vs 0.11, difference
    -0.03 to +0.92), so it is not asserted."""
    from scipy import stats

    _, cells = demo

    def mean_margin(C: np.ndarray) -> float:
        return float(np.mean([C[t, k] - C[k, k] for t in range(C.shape[0]) for k in range(t)]))

    diff = np.array([mean_margin(cells[("psp", "psp", "recall@1", s)][0]) - mean_margin(cells[("lsp", "lsp", "recall@1", s)][0])
                     for s in SEEDS])
    half = stats.t.ppf(0.975, len(diff) - 1) * diff.std(ddof=1) / np.sqrt(len(diff))
    assert diff.mean() - half > 0, (diff, half)


def test_cores_under_recall_at_1_is_not_compatible_as_paper_000_reports(demo):
    _, cells = demo
    assert all(cells[("cores", "encoder", "recall@1", seed)][1]["AC"] == 0 for seed in SEEDS)
