"""Fingerprints (engine/core/fingerprint.py, issue 42 item 3): the record round-trips through JSON, an exported adapter
records its input and output spaces' fingerprints, Parquet files carry one in their metadata, and ``adapter apply``
refuses vectors of another model in one line, warns when only the dimension can be checked."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from engine.adapters.artifact import AdapterFileError, load_adapter, load_fingerprints, save_adapter
from engine.core.fingerprint import (MATCH, METADATA_KEY, MISMATCH, UNKNOWN, Fingerprint, carried_or_declared, compare,
                                     normalisation_of)
from engine.sources import open_source
from support.adapters_export import pairs, run, small_map  # noqa: F401 (fixtures among them)

HASH_A, HASH_B = "a" * 64, "b" * 64


def test_a_fingerprint_round_trips_through_json_and_refuses_bad_fields():
    fp = Fingerprint(384, sha256=HASH_A, name="minilm-l6", normalisation="unit", prefix="query: ", pooling="mean")
    assert Fingerprint.from_json(json.loads(json.dumps(fp.to_json()))) == fp
    assert Fingerprint.from_text(json.dumps({"dim": 8})) == Fingerprint(8)
    for bad, said in (({"dim": 0}, "dim"), ({"dim": 8, "sha256": "xyz"}, "sha256"), ({"dim": 8, "colour": 1}, "colour"),
                      ({"dim": 8, "normalisation": "l1"}, "normalisation"), ({"dim": 8, "name": "a\nb"}, "one line"),
                      ([8], "not an object"), ({"name": "m"}, "no dim")):
        with pytest.raises(ValueError, match=said) as exc:
            Fingerprint.from_json(bad)
        assert "\n" not in str(exc.value)


def test_normalisation_is_measured_within_its_tolerance():
    x = np.random.default_rng(0).standard_normal((50, 7))
    assert normalisation_of(x) == "raw"
    unit = x / np.linalg.norm(x, axis=1, keepdims=True)
    assert normalisation_of(unit.astype(np.float32)) == "unit"
    unit[3] *= 1.01  # one row off by 1 %: raw
    assert normalisation_of(unit) == "raw"


def test_compare_decides_by_hash_then_name_and_says_when_it_cannot():
    a = Fingerprint(384, sha256=HASH_A, name="l6", normalisation="unit")
    assert compare(a, Fingerprint(384, sha256=HASH_A))[0] == MATCH
    assert compare(a, Fingerprint(384, sha256=HASH_B, name="l6"))[0] == MISMATCH  # the hash decides over the name
    assert compare(a, Fingerprint(384, name="l6"))[0] == MATCH
    assert compare(a, Fingerprint(384, name="l3"))[0] == MISMATCH
    assert compare(a, Fingerprint(768, sha256=HASH_A)) == (MISMATCH, "768-d vectors, not 384-d")
    assert compare(a, Fingerprint(384, name="l6", normalisation="raw"))[0] == MISMATCH
    assert compare(a, Fingerprint(384, name="l6", normalisation="raw"), ignore=("normalisation",))[0] == MATCH
    assert compare(Fingerprint(384, sha256=HASH_A), Fingerprint(384, name="l6"))[0] == UNKNOWN
    assert compare(a, Fingerprint(384))[0] == UNKNOWN


def test_a_declared_name_fills_or_contradicts_the_carried_one():
    assert carried_or_declared(None, None, 8, what="--in") is None
    assert carried_or_declared(None, "m", 8, what="--in") == Fingerprint(8, name="m")
    assert carried_or_declared(Fingerprint(8, sha256=HASH_A), "m", 8, what="--in") == Fingerprint(8, HASH_A, "m")
    with pytest.raises(ValueError, match="carries vectors of 'x', not of 'm' as declared"):
        carried_or_declared(Fingerprint(8, name="x"), "m", 8, what="--in")


def test_an_adapter_records_its_spaces_and_an_old_folder_without_them_still_loads(tmp_path):
    m = small_map()
    spaces = {"input": Fingerprint(6, sha256=HASH_A, normalisation="raw"), "output": Fingerprint(4, name="old")}
    save_adapter(m, tmp_path / "a", fingerprints=spaces)
    assert load_fingerprints(tmp_path / "a") == spaces
    assert load_adapter(tmp_path / "a").new_dim == 6
    info = json.loads((tmp_path / "a" / "adapter.json").read_text())
    assert info["fingerprints"]["input"]["sha256"] == HASH_A
    del info["fingerprints"]  # a folder written before fingerprints
    (tmp_path / "a" / "adapter.json").write_text(json.dumps(info))
    assert load_fingerprints(tmp_path / "a") is None and load_adapter(tmp_path / "a").old_dim == 4
    with pytest.raises(AdapterFileError, match="the input fingerprint is 5-d, the adapter's input 6-d"):
        save_adapter(m, tmp_path / "b", fingerprints={**spaces, "input": Fingerprint(5)})
    assert not (tmp_path / "b").exists()


def _parquet(path, ids, vectors, fingerprint: Fingerprint | None = None) -> str:
    table = pa.table({"id": ids, "vector": pa.FixedSizeListArray.from_arrays(
        pa.array(np.asarray(vectors, np.float32).reshape(-1)), vectors.shape[1])})
    if fingerprint is not None:
        table = table.replace_schema_metadata({METADATA_KEY: json.dumps(fingerprint.to_json())})
    pq.write_table(table, path)
    return str(path)


def test_a_parquet_source_reports_the_fingerprint_of_its_metadata_and_refuses_a_bad_one(tmp_path):
    x = np.ones((3, 4))
    src = open_source(_parquet(tmp_path / "a.parquet", [1, 2, 3], x, Fingerprint(4, name="m")), what="t")
    assert src.fingerprint == Fingerprint(4, name="m") and src.fingerprint_parts == [("a.parquet", 3, src.fingerprint)]
    assert open_source(_parquet(tmp_path / "b.parquet", [1, 2, 3], x), what="t").fingerprint is None
    pq.write_table(pa.table({"id": [1], "vector": [[1.0]]}).replace_schema_metadata({METADATA_KEY: "{"}),
                   tmp_path / "c.parquet")
    with pytest.raises(ValueError, match="compatlab.fingerprint metadata is not valid JSON"):
        open_source(str(tmp_path / "c.parquet"), what="t")


def test_fit_records_the_spaces_and_apply_refuses_another_model_in_one_line(pairs, capsys):  # noqa: F811
    root, new_ids, new = pairs
    code, out, err = run(["adapter", "fit", "--old", str(root / "old.npz"), "--new", str(root / "new.npz"),
                          "--kind", "procrustes", "--pairs", "300", "--held-out", "100", "--resamples", "20",
                          "--new-model", "new-v2", "--old-model", "old-v1", "--out", str(root / "ad")], capsys)
    assert code == 0, err
    spaces = load_fingerprints(root / "ad")
    assert spaces["input"] == Fingerprint(14, name="new-v2", normalisation="raw")
    assert spaces["output"] == Fingerprint(10, name="old-v1", normalisation="raw")
    assert "fingerprints: input 'new-v2', 14-d, raw; output 'old-v1', 10-d, raw" in out

    def apply(src: str, *extra: str):
        return run(["adapter", "apply", "--adapter", str(root / "ad"), "--in", src, "--out", str(root / "o.npy"),
                    "--force", *extra], capsys)

    # a store of another model, by its metadata, and by a declared name: refused, nothing written
    other = _parquet(root / "other.parquet", new_ids, new, Fingerprint(14, name="someone-else"))
    code, _, err = apply(other)
    assert code == 2 and err.count("\n") == 1 and not (root / "o.npy").exists()
    assert "vectors of 'someone-else', not of 'new-v2'" in err and "nothing was written" in err
    code, _, err = apply(str(root / "new.npz"), "--model", "new-v3")
    assert code == 2 and "not of 'new-v2'" in err
    # the same model, by metadata or declared: applied, silently
    same = _parquet(root / "same.parquet", new_ids, new, Fingerprint(14, name="new-v2", normalisation="raw"))
    for src, extra in ((same, ()), (str(root / "new.npz"), ("--model", "new-v2"))):
        code, out, err = apply(src, *extra)
        assert code == 0 and err == "" and out.startswith("600 vectors mapped")
    # nothing carried, nothing declared: applied on the dimension alone, with a warning line
    code, out, err = apply(str(root / "new.npz"))
    assert code == 0 and err.count("\n") == 1 and "checked on its dimension alone (14-d)" in err
    # a folder whose files carry two models is refused before anything is mapped
    (root / "mixed").mkdir()
    _parquet(root / "mixed" / "a.parquet", new_ids[:300], new[:300], Fingerprint(14, name="new-v2"))
    _parquet(root / "mixed" / "b.parquet", new_ids[300:], new[300:], Fingerprint(14, name="other"))
    code, _, err = apply(str(root / "mixed"))
    assert code == 2 and "mixes vectors of several models" in err and "doctor" in err
    _parquet(root / "mixed" / "b.parquet", new_ids[300:], new[300:])  # one file without a fingerprint: said, applied
    code, out, err = apply(str(root / "mixed"))
    assert code == 0 and err.strip() == ("warning: 1 of the 2 files of --in carry no fingerprint; they are taken to "
                                         "hold vectors of the others' model")


# --------------------------------------------------------------------------------------------- stored feature sets
def test_a_recorded_version_stores_each_views_fingerprint_and_an_older_row_still_loads(tmp_path):
    import hashlib
    import sqlite3

    from sqlalchemy import create_engine

    from engine.results.record import NewVersion, record_experiment
    from storage import (add_model_version, feature_set_fingerprint, get_engine, load_feature_set, save_feature_set,
                         session_scope)
    from storage.migrate import add_missing_columns

    rng = np.random.default_rng(4)
    enc = rng.standard_normal((12, 5)).astype(np.float32)
    unit = (enc / np.linalg.norm(enc, axis=1, keepdims=True)).astype(np.float32)
    weights = tmp_path / "w.pt"
    weights.write_bytes(b"weights of a model")
    labels = np.arange(12) % 3
    path = tmp_path / "x.db"
    db = get_engine(f"sqlite:///{path}")
    versions = [NewVersion(architecture="resnet18", method="bct", classes=range(3), num_outputs=3, feature_dim=5,
                           outputs={"gallery": {"encoder": enc, "logits": unit[:, :3]}}, labels={"gallery": labels},
                           checkpoint_path=str(weights)),
                NewVersion(architecture="text", method="checkpoints", classes=range(3), num_outputs=3, feature_dim=5,
                           outputs={"gallery": {"encoder": unit}}, labels={"gallery": labels}, name="minilm",
                           weights_sha256=HASH_B, pooling="mean")]
    exp = record_experiment(db, name="e", method="bct", config={}, versions=versions, results={}, gallery_kind="instance")
    with session_scope(db) as s:
        from storage.models import ModelVersion

        first, second = (mv.id for mv in s.query(ModelVersion).order_by(ModelVersion.step))
        assert feature_set_fingerprint(s, first, "gallery", "encoder") == {
            "dim": 5, "sha256": hashlib.sha256(b"weights of a model").hexdigest(),
            "name": f"resnet18 bct, experiment {exp} step 1", "normalisation": "raw", "prefix": None, "pooling": None}
        assert feature_set_fingerprint(s, first, "gallery", "logits")["dim"] == 3
        assert feature_set_fingerprint(s, second, "gallery", "encoder") == Fingerprint(
            5, sha256=HASH_B, name="minilm", normalisation="unit", pooling="mean").to_json()
        old = add_model_version(s, exp, 3, architecture="a", method="m", classes=[0], num_outputs=1, feature_dim=5).id
        save_feature_set(s, old, "gallery", "encoder", enc, labels)  # as a set stored before fingerprints
        with pytest.raises(ValueError, match="fingerprint must be a JSON object with dim 5"):
            save_feature_set(s, old, "gallery", "encoder", enc, labels, fingerprint={"dim": 4})
    with session_scope(db) as s:
        assert feature_set_fingerprint(s, old, "gallery", "encoder") is None
        np.testing.assert_array_equal(load_feature_set(s, old, "gallery", "encoder")[0], enc)
    db.dispose()
    with sqlite3.connect(path) as c:  # a database made before fingerprints: the column is added, its rows still load
        c.execute("ALTER TABLE feature_sets DROP COLUMN fingerprint")
    c.close()
    older = create_engine(f"sqlite:///{path}")
    assert add_missing_columns(older) == ["feature_sets.fingerprint"]
    with session_scope(older) as s:
        assert feature_set_fingerprint(s, first, "gallery", "encoder") is None
        np.testing.assert_array_equal(load_feature_set(s, first, "gallery", "encoder")[0], enc)


def test_fit_refuses_a_store_whose_fingerprint_contradicts_its_vectors(pairs, capsys):  # noqa: F811
    root, new_ids, new = pairs
    lying = _parquet(root / "lying.parquet", new_ids, new, Fingerprint(10, name="new-v2"))  # 14-d vectors
    code, _, err = run(["adapter", "fit", "--old", str(root / "old.npz"), "--new", lying, "--kind", "procrustes",
                        "--pairs", "300", "--held-out", "100", "--resamples", "20", "--out", str(root / "ad")], capsys)
    assert code == 2 and err == "error: --new: the store's fingerprint says 10-d vectors, it holds 14-d ones\n"
    assert not (root / "ad").exists()
    code, _, err = run(["adapter", "fit", "--old", str(root / "old.npz"), "--new", str(root / "new.npz"), "--kind",
                        "procrustes", "--pairs", "300", "--held-out", "100", "--resamples", "20", "--out",
                        str(root / "ad")], capsys)
    assert code == 0, err
    code, _, err = run(["adapter", "apply", "--adapter", str(root / "ad"), "--in", lying, "--out", str(root / "o.npy")],
                       capsys)
    assert code == 2 and err == "error: --in: the store's fingerprint says 10-d vectors, it holds 14-d ones\n"
