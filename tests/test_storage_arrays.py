"""storage.NpyArray: arrays go through the database bit-exact as .npy bytes, and pickle is never involved."""
import io

import numpy as np
import pytest
from sqlalchemy import func, select, text

from storage import (
    Analysis,
    NpyArray,
    create_experiment,
    load_analysis,
    save_analysis,
    session_scope,
)

pytestmark = pytest.mark.both_databases  # tests/conftest.py: SQLite and a throw-away PostgreSQL

# A NaN with a non-default payload: any float conversion on the way would canonicalise it.
ODD_NAN = np.array([0x7FF8_0000_0000_0001], dtype=np.uint64).view(np.float64)[0]
SPECIALS = [np.nan, -0.0, 0.0, np.inf, -np.inf, 1e-300, -1.5]

ARRAYS = {
    "float64 specials": np.array(SPECIALS + [ODD_NAN], dtype=np.float64),
    "float32 specials": np.array(SPECIALS[:5] + [3.4e38], dtype=np.float32),
    "float16 specials": np.array(SPECIALS[:5] + [65504.0], dtype=np.float16),
    "lower-triangular matrix, NaN above": np.where(np.tri(4, dtype=bool), np.arange(16.0).reshape(4, 4), np.nan),
    "int8": np.array([-128, 0, 127], dtype=np.int8),
    "int64": np.array([[np.iinfo(np.int64).min, np.iinfo(np.int64).max]], dtype=np.int64),
    "uint16": np.arange(6, dtype=np.uint16).reshape(2, 3),
    "bool": np.array([True, False, True]),
    "0-d": np.array(-0.0),
    "empty 1-d": np.empty(0, dtype=np.float32),
    "empty 2-d": np.empty((0, 5), dtype=np.float64),
    "fortran order": np.asfortranarray(np.arange(12.0).reshape(3, 4)),
    "non-contiguous slice": np.arange(20.0)[::3],
    "big-endian": np.arange(4, dtype=">f8"),
    "fixed-width strings": np.array(["img_001.png", "b"]),
}


@pytest.fixture
def experiment_id(engine):
    with session_scope(engine) as session:
        return create_experiment(session, name="e", method="plain", config={}, config_hash="h").id


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("name", ARRAYS)
def test_array_round_trips_bit_exact_through_the_database(engine, experiment_id, name):
    original = ARRAYS[name]
    with session_scope(engine) as session:
        save_analysis(session, experiment_id, "test", name, {}, original.copy(order="K"))
    with session_scope(engine) as session:
        loaded = load_analysis(session, experiment_id, "test", name).array
    assert same_bits(loaded, original)
    if original.dtype.kind == "f":
        assert np.array_equal(np.signbit(loaded), np.signbit(original))
        assert np.array_equal(np.isnan(loaded), np.isnan(original))


def test_stored_bytes_are_plain_npy_loadable_without_pickle(engine, experiment_id):
    features = np.array([[np.nan, -0.0], [np.inf, 1.0]], dtype=np.float32)
    with session_scope(engine) as session:
        save_analysis(session, experiment_id, "test", "raw", {}, features)
    with engine.connect() as connection:
        raw = connection.execute(text('SELECT "array" FROM analyses')).scalar_one()
    assert raw.startswith(b"\x93NUMPY")
    assert same_bits(np.load(io.BytesIO(raw), allow_pickle=False), features)


@pytest.mark.parametrize("array", [np.array([{"a": 1}, None], dtype=object),
                                   np.array(["a", "bb"], dtype=np.dtypes.StringDType())],
                         ids=["object", "StringDType"])
def test_arrays_that_need_pickle_are_refused_and_nothing_is_written(engine, experiment_id, array):
    with pytest.raises(ValueError, match="pickle"):
        with session_scope(engine) as session:
            save_analysis(session, experiment_id, "test", "objects", {}, array)
    with pytest.raises(ValueError, match="pickle"):
        NpyArray().process_bind_param(array, engine.dialect)
    with session_scope(engine) as session:
        assert session.scalar(select(func.count()).select_from(Analysis)) == 0


def test_a_pickled_blob_in_the_database_is_not_unpickled(engine, experiment_id):
    buffer = io.BytesIO()
    np.save(buffer, np.array([{"evil": 1}], dtype=object), allow_pickle=True)
    with session_scope(engine) as session:
        save_analysis(session, experiment_id, "test", "pickled", {}, np.zeros(1))
    with engine.begin() as connection:
        connection.execute(text('UPDATE analyses SET "array" = :blob'), {"blob": buffer.getvalue()})
    with pytest.raises(ValueError, match="allow_pickle"):
        with session_scope(engine) as session:
            load_analysis(session, experiment_id, "test", "pickled")
