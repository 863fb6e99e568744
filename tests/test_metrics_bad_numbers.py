"""Bad numbers never reach the compiled ranking kernel as a crash or a wrong metric.

Float64 features above the float32 maximum became inf after the cast and NaN after normalisation:
with mAP the numba kernel indexed out of bounds (segfault), with Recall@1 alone the cell read 100 %.
Each case runs in a subprocess, so a crash fails the test instead of killing pytest.
"""
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from engine.metrics.ranking import stats_numba, stats_torch

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_overflowing_float64_features_and_nan_similarities_give_errors_not_crashes():
    proc = _run("""
        import numpy as np
        from engine.metrics.retrieval import retrieval_metrics
        from engine.metrics.ranking import stats_numba
        rng = np.random.default_rng(0)
        g = rng.normal(size=(40, 8)); labels = np.repeat(np.arange(4), 10)
        q = g.copy(); q[3, 0] = 1e39  # finite in float64, inf in float32
        for compute_map in (True, False):
            try:
                retrieval_metrics(q, labels, g, labels, ks=(1,), compute_map=compute_map)
            except ValueError as exc:
                print("refused:", exc)
        sims = rng.normal(size=(6, 20)).astype(np.float32)
        sims[0, 3] = np.nan; sims[1, :] = np.nan; sims[2, 5] = np.inf; sims[3, 0:5] = np.nan
        starts, ends = np.zeros(6, np.int64), np.full(6, 5, np.int64)
        for want_ap in (True, False):
            try:
                stats_numba(sims, starts, ends, want_ap=want_ap)
            except ValueError as exc:
                print("refused:", exc)
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]  # a segfault is -11
    lines = proc.stdout.splitlines()
    assert len(lines) == 4, proc.stdout
    assert "float32 range" in lines[0] and "float32 range" in lines[1] and "row 3" in lines[0]
    assert "NaN/inf values in 4 query row(s) (first: row 0)" in lines[2] and "(first: row 0)" in lines[3]


def test_column_ranges_outside_the_block_are_refused():
    sims = np.zeros((2, 4), np.float32)
    with pytest.raises(ValueError, match="within the block's 4 columns"):
        stats_numba(sims, np.array([0, 2]), np.array([1, 9]))
    with pytest.raises(ValueError, match="within the block's 4 columns"):
        stats_numba(sims, np.array([-1, 0]), np.array([1, 1]))


def test_finite_blocks_keep_their_statistics():
    """The flag pass does not change results: kernel against the torch implementation on random blocks with ties."""
    import torch

    rng = np.random.default_rng(1)
    sims = np.round(rng.normal(size=(30, 50)), 1).astype(np.float32)
    sims[::7, 4] = -np.inf
    starts = rng.integers(0, 25, 30)
    ends = starts + rng.integers(0, 25, 30)
    for want_ap in (True, False):
        a = stats_numba(sims, starts, ends, want_ap=want_ap)
        b = stats_torch(torch.from_numpy(sims), torch.from_numpy(starts), torch.from_numpy(ends), want_ap=want_ap)
        for f in ("n_positives", "neg_ge_best", "neg_gt_best", "ap"):
            np.testing.assert_allclose(getattr(a, f), getattr(b, f), rtol=1e-6)
