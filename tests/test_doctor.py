"""``python -m engine doctor SRC`` (engine/analysis/doctor.py, engine/metrics/mixture.py; issue 42 item 4).

Two "models" are two random orthogonal maps of the same latent items (low-rank, clustered, with a common direction,
as real embeddings are anisotropic); a store holding 70 % of the items under one map and 30 % under the other is
found mixed, with the groups' counts within TOLERANCE of 70/30; a store of one map passes. The equal-norm variant
(every row of unit length) leaves the norm test nothing to read, so the neighbour test must find the split."""
from __future__ import annotations

import json
import sqlite3

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.analysis.doctor import diagnose
from engine.cli import main
from engine.core.fingerprint import METADATA_KEY, Fingerprint
from engine.metrics.mixture import CROSS_SHARE, Z_EDGE, space_split, zero_tails
from engine.sources import open_source

N, D, RANK, MINOR = 3000, 64, 8, 900  # 2100 / 900 = 70 / 30
TOLERANCE = 0.03  # a 2,000-item sample's share of a 30 % group has a standard deviation of 1 percentage point


def latent(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    basis = np.linalg.qr(rng.standard_normal((D, RANK)))[0]
    centres = 1.5 * rng.standard_normal((30, RANK))
    z = centres[rng.integers(0, 30, N)] + rng.standard_normal((N, RANK)) + 2 * rng.standard_normal(RANK)
    return z @ basis.T + 0.1 * rng.standard_normal((N, D))


def rotation(seed: int) -> np.ndarray:
    return np.linalg.qr(np.random.default_rng(seed).standard_normal((D, D)))[0]


def stores() -> dict[str, np.ndarray]:
    z = latent()
    a, b = z @ rotation(1), z @ rotation(2)
    mixed = np.vstack([a[:N - MINOR], 2.5 * b[N - MINOR:]])  # the second model's norms 2.5x larger
    unit = mixed / np.linalg.norm(mixed, axis=1, keepdims=True)
    return {"clean": a, "mixed": mixed, "unit": unit}


def write_parquet(path, vectors, fingerprint: Fingerprint | None = None, ids=None) -> str:
    ids = np.arange(len(vectors)) if ids is None else ids
    table = pa.table({"id": ids, "vector": pa.FixedSizeListArray.from_arrays(
        pa.array(np.asarray(vectors, np.float32).reshape(-1)), vectors.shape[1])})
    if fingerprint is not None:
        table = table.replace_schema_metadata({METADATA_KEY: json.dumps(fingerprint.to_json())})
    pq.write_table(table, path, row_group_size=700)
    return str(path)


def minor_share(test: dict) -> float:
    return test["groups"][1]["items_estimated"] / N


def test_the_cross_edge_share_is_the_share_of_beyond_chance_pairs_across_the_split():
    """The statistic recomputed by brute force from the returned groups."""
    x = stores()["unit"][::3]
    split = space_split(x)
    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    edges = np.abs(u @ u.T) > Z_EDGE / np.sqrt(D)
    np.fill_diagonal(edges, False)
    g = split.groups.astype(bool)
    assert split.stats["cross_edge_share"] == pytest.approx(edges[g][:, ~g].sum() / (edges.sum() / 2), abs=1e-9)
    assert split.stats["density"] == pytest.approx(edges.sum() / (len(x) * (len(x) - 1)), abs=1e-9)


def test_a_70_30_mixed_parquet_store_is_found_with_its_counts_and_a_clean_one_passes(tmp_path, capsys):
    data = stores()
    reports = {}
    for name, x in data.items():
        path = write_parquet(tmp_path / f"{name}.parquet", x)
        code = main(["doctor", path, "--json", str(tmp_path / f"{name}.json")])
        out = capsys.readouterr().out
        reports[name] = json.loads((tmp_path / f"{name}.json").read_text())
        assert code == (0 if name == "clean" else 1), out
        assert out.strip().splitlines()[-1].startswith(f"verdict: {'clean' if name == 'clean' else 'mixed'}")
    clean, mixed, unit = (reports[k]["tests"] for k in ("clean", "mixed", "unit"))
    # clean: one population of norms, a split keeping a large share of the edges across
    assert clean["norms"]["verdict"] == "clean" and clean["neighbours"]["verdict"] == "clean"
    assert clean["neighbours"]["cross_edge_share"] > 4 * CROSS_SHARE  # 0.39 here
    assert clean["dimension"]["verdict"] == "clean" and clean["dimension"]["groups"] == [{"dims": D, "items": N}]
    # mixed with different norms: both sampled tests find it, the counts near 70/30
    for test in ("norms", "neighbours"):
        assert mixed[test]["verdict"] == "mixed"
        assert abs(minor_share(mixed[test]) - MINOR / N) <= TOLERANCE, mixed[test]
    assert mixed["neighbours"]["cross_edge_share"] <= CROSS_SHARE
    # equal norms: the norm test has nothing to read; the neighbours find the split
    assert unit["norms"]["verdict"] == "undecided" and unit["neighbours"]["verdict"] == "mixed"
    assert abs(minor_share(unit["neighbours"]) - MINOR / N) <= TOLERANCE
    assert reports["unit"]["sample"] == 2000 and reports["unit"]["items"] == N


def test_the_neighbour_groups_are_the_two_models_items():
    """Not only the counts: the minor group is the second model's rows (the sample keeps row order per item)."""
    x = stores()["unit"]
    split = space_split(x[::2])
    truth = (np.arange(N)[::2] >= N - MINOR).astype(np.int64)
    assert np.mean(split.groups == truth) >= 1 - TOLERANCE


def test_zero_padded_vectors_of_a_smaller_model_are_counted_exactly(tmp_path, capsys):
    z = latent()
    small = z[:, :48] @ np.linalg.qr(np.random.default_rng(3).standard_normal((48, 48)))[0]
    x = z @ rotation(1)
    x[N - MINOR:] = 0
    x[N - MINOR:, :48] = small[N - MINOR:]
    assert (zero_tails(x[N - MINOR:]) >= 16).all()
    code = main(["doctor", write_parquet(tmp_path / "p.parquet", x)])
    out = capsys.readouterr().out
    assert code == 1 and "dimension: mixed" in out
    report = diagnose(open_source(str(tmp_path / "p.parquet"), what="t"))
    assert report["tests"]["dimension"]["groups"] == [
        {"dims": D, "items": N - MINOR}, {"dims": 48, "items": MINOR, "note": "zero-padded to the store's width"}]


def test_files_carrying_two_fingerprints_are_mixed_by_fingerprint(tmp_path, capsys):
    x = stores()["clean"]
    (tmp_path / "d").mkdir()
    write_parquet(tmp_path / "d" / "a.parquet", x[:2000], Fingerprint(D, name="m1"), ids=np.arange(2000))
    write_parquet(tmp_path / "d" / "b.parquet", x[2000:], Fingerprint(D, name="m2"), ids=np.arange(2000, N))
    report = diagnose(open_source(str(tmp_path / "d"), what="t"))
    fps = report["tests"]["fingerprints"]
    assert fps["verdict"] == "mixed" and report["verdict"] == "mixed"
    assert sorted((g["model"], g["items"]) for g in fps["groups"]) == [("'m1', 64-d", 2000), ("'m2', 64-d", 1000)]
    write_parquet(tmp_path / "d" / "b.parquet", x[2000:], Fingerprint(D, name="m1"), ids=np.arange(2000, N))
    assert diagnose(open_source(str(tmp_path / "d"), what="t"))["tests"]["fingerprints"]["verdict"] == "clean"
    write_parquet(tmp_path / "d" / "b.parquet", x[2000:], ids=np.arange(2000, N))  # a file without one: unknown
    fps = diagnose(open_source(str(tmp_path / "d"), what="t"))["tests"]["fingerprints"]
    assert fps["verdict"] == "clean" and fps["statistic"].endswith("1 without one")


def test_a_mixed_sqlite_store_is_found_through_the_sql_reader(tmp_path, capsys):
    x = stores()["unit"]
    path = tmp_path / "e.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE items (id INTEGER, vector TEXT)")
        conn.executemany("INSERT INTO items VALUES (?, ?)", [(i, json.dumps(v.tolist())) for i, v in enumerate(x)])
    conn.close()
    code = main(["doctor", f"sql:sqlite:///{path}#table=items", "--sample", "1500", "--block-rows", "500"])
    out = capsys.readouterr().out
    assert code == 1 and "neighbours: mixed" in out and "1500 sampled" in out


def test_bad_arguments_are_one_line(tmp_path, capsys):
    path = write_parquet(tmp_path / "c.parquet", stores()["clean"][:100])
    for argv, said in ((["--sample", "5"], "--sample must lie in [20, 10000]"), (["--block-rows", "0"], "--block-rows")):
        assert main(["doctor", path, *argv]) == 2
        err = capsys.readouterr().err
        assert said in err and err.count("\n") == 1


def test_a_mixed_lancedb_table_and_its_fingerprint_are_read(tmp_path):
    lancedb = pytest.importorskip("lancedb")
    x = stores()["unit"]
    table = pa.table({"id": np.arange(N), "vector": pa.FixedSizeListArray.from_arrays(
        pa.array(x.astype(np.float32).reshape(-1)), D)})
    table = table.replace_schema_metadata({METADATA_KEY: json.dumps(Fingerprint(D, name="m").to_json())})
    lancedb.connect(str(tmp_path / "lance")).create_table("items", table)
    source = open_source(f"lance:{tmp_path / 'lance'}#table=items", what="t")
    assert source.fingerprint == Fingerprint(D, name="m")
    report = diagnose(source, block_rows=1000)
    assert report["verdict"] == "mixed" and report["tests"]["fingerprints"]["verdict"] == "clean"
    assert abs(minor_share(report["tests"]["neighbours"]) - MINOR / N) <= TOLERANCE


def test_isotropic_noise_is_undecided_by_the_neighbours_and_the_json_is_strict(tmp_path, capsys):
    """No structure to split (and two rotations of it could not be told apart): clean, said as undecided."""
    x = np.random.default_rng(7).standard_normal((1000, D))
    code = main(["doctor", write_parquet(tmp_path / "n.parquet", x), "--json", str(tmp_path / "n.json")])
    out = capsys.readouterr().out
    assert code == 0 and "neighbours: undecided: too few pairs beyond chance" in out
    report = json.loads((tmp_path / "n.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    assert report["tests"]["neighbours"]["cross_edge_share"] is None
