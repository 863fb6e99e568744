"""Shared by several test modules; moved from tests/test_sources.py."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support.featurestore import s3_root  # noqa: F401  (moto's S3 server on 127.0.0.1)

N, D = 200, 16


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(27)
    ids = rng.permutation(np.arange(1000, 1000 + N)).astype(np.int64)
    vectors = rng.standard_normal((N, D)).astype(np.float32)
    labels = rng.integers(0, 5, N).astype(np.int64)
    return ids, vectors, labels


def fingerprint(folder: Path) -> dict[str, tuple[str, int]]:
    """Every file under a folder: its hash and mtime (what 'nothing written' compares)."""
    return {str(p.relative_to(folder)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def fixed_list(vectors):
    return pa.FixedSizeListArray.from_arrays(pa.array(vectors.ravel()), vectors.shape[1])


def write_parquet(path, data, *, vector_type="fixed"):
    ids, vectors, labels = data
    column = fixed_list(vectors) if vector_type == "fixed" else pa.array(list(vectors), pa.list_(pa.float32()))
    pq.write_table(pa.table({"doc_id": ids, "emb": column, "cls": labels}), path, row_group_size=50)
    return path

