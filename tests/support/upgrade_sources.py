"""Shared by several test modules; moved from tests/test_upgrade_sources.py."""
from __future__ import annotations

import json
import sqlite3

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.upgrade.from_sources import SourceSpecs, check_sources
from support.sources import fixed_list

NG, NQ, D, CLASSES, K = 240, 48, 12, 6, 10


RESAMPLES = 300


SIDES = ("old_gallery", "new_gallery", "old_queries", "new_queries")


def embeddings(seed: int = 27, *, new: str = "drift"):
    """Old and new embeddings of the same gallery items and queries; ``new``: drift (a partly related model),
    rotation (an orthogonal copy of the old space) or same (the old vectors)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(CLASSES, D))
    g_labels, q_labels = rng.integers(0, CLASSES, NG), rng.integers(0, CLASSES, NQ)
    old_g = (centres[g_labels] + 1.3 * rng.normal(size=(NG, D))).astype(np.float32)
    old_q = (centres[q_labels] + 1.3 * rng.normal(size=(NQ, D))).astype(np.float32)
    if new == "same":
        mix = np.eye(D)
    elif new == "rotation":
        mix, _ = np.linalg.qr(rng.normal(size=(D, D)))
    else:
        mix = np.eye(D) + 0.7 * rng.normal(size=(D, D)) / np.sqrt(D)
    new_g, new_q = (old_g @ mix).astype(np.float32), (old_q @ mix).astype(np.float32)
    if new == "same":
        new_g, new_q = old_g.copy(), old_q.copy()
    return {"old_gallery": old_g, "new_gallery": new_g, "old_queries": old_q, "new_queries": new_q,
            "g_labels": g_labels, "q_labels": q_labels}


def ids_for(e, *, text: bool):
    if text:
        return np.array([f"doc-{i:04d}" for i in range(NG)]), np.array([f"q/{i}" for i in range(NQ)])
    return np.arange(5000, 5000 + NG, dtype=np.int64), np.arange(100, 100 + NQ, dtype=np.int64)


def tables(e, *, text: bool = False, seed: int = 3):
    """Each side as (ids, vectors, labels), every side in its own shuffled order."""
    g_ids, q_ids = ids_for(e, text=text)
    rng = np.random.default_rng(seed)
    out = {}
    for side in SIDES:
        ids, labels = (g_ids, e["g_labels"]) if "gallery" in side else (q_ids, e["q_labels"])
        order = rng.permutation(len(ids))
        out[side] = (ids[order], e[side][order], labels[order])
    return out


def write(kind: str, folder, name: str, table, *, pg_url: str | None = None) -> str:
    """One side written in a store of ``kind``; returns its source text."""
    ids, vectors, labels = table
    if kind == "npz":
        np.savez(folder / f"{name}.npz", ids=ids, vectors=vectors, **({} if labels is None else {"labels": labels}))
        return str(folder / f"{name}.npz")
    if kind == "parquet":
        pq.write_table(pa.table({"doc": ids, "emb": fixed_list(vectors), "cls": labels}), folder / f"{name}.parquet",
                       row_group_size=64)
        return f"parquet:{folder / f'{name}.parquet'}#id=doc&vector=emb&label=cls"
    if kind == "lance":
        import lancedb

        lancedb.connect(str(folder / "lance")).create_table(
            name, pa.table({"id": ids, "vector": fixed_list(vectors), "label": labels}))
        return f"lance:{folder / 'lance'}#table={name}"
    if kind == "qdrant":
        import qdrant_client
        from qdrant_client import models

        client = qdrant_client.QdrantClient(path=str(folder / f"qd_{name}"))
        client.create_collection(name, vectors_config=models.VectorParams(size=D, distance=models.Distance.COSINE))
        client.upsert(name, [models.PointStruct(id=int(i), vector=v.tolist(), payload={"label": int(lab)})
                             for i, v, lab in zip(ids, vectors, labels, strict=True)])
        client.close()
        return f"qdrant:{folder / f'qd_{name}'}#collection={name}"
    rows = [(int(i), json.dumps(v.tolist()), int(lab)) for i, v, lab in zip(ids, vectors, labels, strict=True)]
    if kind == "sqlite":
        with sqlite3.connect(folder / "e.db") as conn:
            conn.execute(f"CREATE TABLE {name} (id INTEGER, vector TEXT, label INTEGER)")
            conn.executemany(f"INSERT INTO {name} VALUES (?, ?, ?)", rows)
        conn.close()
        return f"sql:sqlite:///{folder / 'e.db'}#table={name}"
    from sqlalchemy import create_engine, text

    engine = create_engine(pg_url)
    with engine.begin() as conn:
        conn.execute(text(f"CREATE TABLE {name} (id bigint, vector real[], label int)"))
        conn.execute(text(f"INSERT INTO {name} VALUES (:i, :v, :l)"),
                     [{"i": i, "v": json.loads(v), "l": lab} for i, v, lab in rows])
    engine.dispose()
    return f"sql:{pg_url}#table={name}"


def write_all(kind, folder, tabs, **kw) -> SourceSpecs:
    folder.mkdir(exist_ok=True)
    return SourceSpecs(**{side: write(kind, folder, side, tabs[side], **kw) for side in SIDES})


def run(specs, **kw):
    return check_sources(specs, resamples=RESAMPLES, block_rows=kw.pop("block_rows", 37), **kw)


def close_json(a, b, path: str = "") -> None:
    """Two JSON values equal, numbers to 1e-9 (NaN equal to NaN)."""
    if isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for key in a:
            close_json(a[key], b[key], f"{path}.{key}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            close_json(x, y, f"{path}[{i}]")
    elif isinstance(a, float) or isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-9, abs=1e-9, nan_ok=True), path
    else:
        assert a == b, path
