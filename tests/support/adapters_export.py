"""Shared by several test modules; moved from tests/test_adapters_export.py."""
from __future__ import annotations

import numpy as np
import pytest

from engine.adapters.posthoc import fit_map
from engine.cli import main


@pytest.fixture
def pairs(tmp_path):
    """Old (10-d) and new (14-d) embeddings of 600 labelled items, the new file in another order."""
    rng = np.random.default_rng(29)
    labels = rng.integers(0, 8, 600)
    old = (rng.standard_normal((8, 10)) * 2)[labels] + rng.standard_normal((600, 10))
    q = np.linalg.qr(rng.standard_normal((14, 14)))[0]
    new = np.hstack([old, rng.standard_normal((600, 4))]) @ q + 0.2 * rng.standard_normal((600, 14))
    ids = np.arange(600) * 5 + 3
    perm = rng.permutation(600)
    np.savez(tmp_path / "old.npz", ids=ids, vectors=old.astype(np.float32), labels=labels)
    np.savez(tmp_path / "new.npz", ids=ids[perm], vectors=new[perm].astype(np.float32), labels=labels[perm])
    return tmp_path, ids[perm], new[perm].astype(np.float32)


def small_map(kind: str = "affine"):
    rng = np.random.default_rng(1)
    return fit_map(kind, rng.standard_normal((50, 6)), rng.standard_normal((50, 4)),
                   options={"clusters": 2, "min_members": 5} if kind == "cluster" else None)


# --------------------------------------------------------------------------------------------- the command line
def run(argv, capsys):
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err

