"""Bad feature folders for ``python -m engine evaluate``: exit 2, one line naming the file, no row stored."""
import io
import resource
import zipfile

import numpy as np
import pytest
from sqlalchemy import func, select

from engine.cli import main
from engine.checkpoints.evaluate_folder import MAX_ARRAY_BYTES_ENV
from storage import get_engine, init_db, session_scope
from storage.models import Base
from support.bad_feature_folders import D, N, _good, _raw_members, raw, steps





def _npy(header: dict, payload: bytes, version=(1, 0)) -> bytes:
    buf = io.BytesIO()
    (np.lib.format.write_array_header_1_0 if version == (1, 0) else np.lib.format.write_array_header_2_0)(buf, header)
    return buf.getvalue() + payload


def _zip(path, members: dict[str, bytes], compression=zipfile.ZIP_STORED):
    with zipfile.ZipFile(path, "w", compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)








def _truncate(path):
    np.savez(path, **_good())
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _corrupt(path):
    np.savez(path, **_good())
    data = bytearray(path.read_bytes())
    data[60:400] = bytes(340)
    path.write_bytes(bytes(data))


HUGE = {"descr": "<f4", "fortran_order": False, "shape": (10**7, 10**4)}  # 400 GB declared
F = np.float32
CASES = {  # id -> (builder, substring of the one error line, extra argv)
    "empty query set": (steps({}, {"query_features": np.zeros((0, D), F), "query_labels": np.zeros(0, int)}), "step_2.npz: query_features must be a non-empty 2-D", []),
    "empty gallery": (steps({"gallery_features": np.zeros((0, D), F), "gallery_labels": np.zeros(0, int)}), "step_1.npz: gallery_features must be a non-empty", []),
    "zero dimensions": (steps({"query_features": np.zeros((N, 0), F), "gallery_features": np.zeros((N, 0), F)}), "non-empty 2-D", []),
    "extra key": (steps({"extra": np.ones(3)}), "step_1.npz: unexpected array(s) extra", []),
    "missing key": (steps({"gallery_labels": None}), "step_1.npz: missing array(s) gallery_labels", []),
    "non-npy member": (raw("step_2.npz", lambda p: _zip(p, _raw_members() | {"notes.txt": b"hi"})), "unexpected array(s) notes.txt", []),
    "plain .npy named .npz": (raw("step_2.npz", lambda p: p.write_bytes(_raw_members()["query_features.npy"])), "step_2.npz: not a .npz (zip) archive", []),
    "only .npy files": (lambda f: np.save(f / "step_1.npy", np.ones((3, 3))), "no step_1.npz", []),
    "empty file": (raw("step_2.npz", lambda p: p.write_bytes(b"")), "step_2.npz: not a .npz", []),
    "pickled object array": (steps({"query_features": np.array([object()] * N, dtype=object)}), "never unpickled", []),
    "string features": (steps({"query_features": np.full((N, D), "abc")}), "query_features has dtype <U3", []),
    "structured features": (steps({"query_features": np.zeros(N, dtype=[("a", F), ("b", F)])}), "plain arrays", []),
    "complex features": (steps({"query_features": np.ones((N, D), np.complex64)}), "plain arrays", []),
    "int64 features": (steps({"query_features": np.ones((N, D), np.int64)}), "query_features must be floating point", []),
    "bool features": (steps({"gallery_features": np.ones((N, D), bool)}), "gallery_features must be floating point", []),
    "all-zero rows": (steps({"gallery_features": np.vstack([np.zeros((1, D), F), np.ones((N - 1, D), F)])}), "1 all-zero row(s) in float32 (first: row 0)", []),
    "float64 that underflows to zero": (steps({"query_features": np.full((N, D), 1e-60)}), "all-zero row(s) in float32", []),
    "NaN": (steps({}, {"query_features": np.full((N, D), np.nan, F)}), "step_2.npz: query_features has NaN/inf", []),
    "inf": (steps({"gallery_features": np.full((N, D), np.inf, F)}), "gallery_features has NaN/inf", []),
    "float64 above float32 max": (steps({"query_features": np.full((N, D), 1e39)}), "query_features has values beyond float32 in 12 row(s)", []),
    "negative labels": (steps({"query_labels": np.full(N, -1)}), "query_labels must lie in 0..2147483647, found -1..-1", []),
    "huge labels": (steps({"gallery_labels": np.full(N, 2**40)}), "gallery_labels must lie in 0..", []),
    "uint64 labels above int64": (steps({"gallery_labels": np.full(N, 2**63, np.uint64)}), "gallery_labels must lie in 0..", []),
    "float labels": (steps({"query_labels": np.zeros(N)}), "query_labels must be integers, got dtype float64", []),
    "bool labels": (steps({"query_labels": np.zeros(N, bool)}), "query_labels must be integers", []),
    "2-D labels": (steps({"query_labels": np.zeros((N, 1), int)}), "query_labels has 12 labels for 12 query_features rows (shape (12, 1))", []),
    "mismatched lengths": (steps({"gallery_labels": np.zeros(N - 1, int)}), "gallery_labels has 11 labels for 12", []),
    "1-D features": (steps({"query_features": np.ones(N, F)}), "query_features must be a non-empty 2-D", []),
    "3-D features": (steps({"gallery_features": np.ones((N, D, 2), F)}), "gallery_features must be a non-empty 2-D", []),
    "query/gallery dimensions differ": (steps({"gallery_features": np.ones((N, D + 1), F)}), "query_features are 4-d but gallery_features are 5-d", []),
    "dimensions differ across steps": (steps({}, {"query_features": np.ones((N, 7), F), "gallery_features": np.ones((N, 7), F)}), "feature dimensions differ between steps", []),
    "header declares 400 GB": (raw("step_2.npz", lambda p: _zip(p, _raw_members(query_features=_npy(HUGE, bytes(64))))), "declares shape (10000000, 10000)", []),
    "header declares less than the member holds": (raw("step_2.npz", lambda p: _zip(p, _raw_members(query_labels=_npy({"descr": "<i8", "fortran_order": False, "shape": (3,)}, bytes(8 * N))))), "but the member holds 96", []),
    "header object dtype": (raw("step_2.npz", lambda p: _zip(p, _raw_members(query_features=_npy({"descr": "|O", "fortran_order": False, "shape": (N, D)}, b"\x80\x04.")))), "never unpickled", []),
    "npy format 3.0": (raw("step_2.npz", lambda p: _zip(p, _raw_members(query_features=b"\x93NUMPY\x03\x00" + bytes(20)))), "format version (3, 0)", []),
    "bad npy magic": (raw("step_2.npz", lambda p: _zip(p, _raw_members(query_features=b"not an npy at all"))), "cannot be read as a .npz", []),
    "inflates beyond the cap": (raw("step_2.npz", lambda p: np.savez_compressed(p, **(_good() | {"gallery_features": np.ones((4000, D), F)}))), "gallery_features inflates to", []),
    "truncated zip": (raw("step_2.npz", _truncate), "step_2.npz: ", []),
    "corrupt zip": (raw("step_2.npz", _corrupt), "step_2.npz: ", []),
    "steps with a gap": (steps({}, {}, names=["step_1.npz", "step_3.npz"]), "numbered 1..T without gaps or repeats, found [1, 3]", []),
    "steps from 2": (steps({}, names=["step_2.npz"]), "found [2]", []),
    "step numbered twice": (steps({}, {}, names=["step_1.npz", "step_01.npz"]), "found [1, 1]", []),
    "no files": (lambda f: None, "no step_1.npz", []),
    "same set with different labels": (steps({}), "same_set=True but query and gallery labels differ", ["--same-set"]),
    "bad metric": (steps({}), "unknown metric 'recall@0'", ["--metric", "recall@0"]),
}
CAP = 16 * 1024  # bytes per array in this test: "inflates beyond the cap" holds 64 KB of ones


def _counts(db) -> dict[str, int]:
    with session_scope(db) as s:
        return {t.name: s.scalar(select(func.count()).select_from(t)) for t in Base.metadata.sorted_tables}


@pytest.fixture(scope="module")
def db_url(tmp_path_factory):
    root = tmp_path_factory.mktemp("fdb")
    url = f"sqlite:///{root / 'f.db'}"
    init_db(get_engine(url))
    good = root / "good"
    good.mkdir()
    steps({}, {})(good)
    assert main(["evaluate", "--features", str(good), "--db", url]) == 0  # a stored evaluation the bad ones must not touch
    return url


@pytest.mark.parametrize("case", list(CASES))
def test_bad_folder_is_refused_in_one_line_naming_the_file(case, db_url, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(MAX_ARRAY_BYTES_ENV, str(CAP))
    build, message, extra = CASES[case]
    folder = tmp_path / "f"
    folder.mkdir()
    build(folder)
    db = get_engine(db_url)
    before = _counts(db)
    capsys.readouterr()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code = main(["evaluate", "--features", str(folder), "--db", db_url, *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ") and message in err, err
    assert _counts(db) == before
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 200_000  # KiB: nothing large was allocated

