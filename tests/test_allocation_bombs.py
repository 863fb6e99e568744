"""Sizes are checked before anything is allocated (issue 39, "allocation bombs"): a small .npz whose members inflate to
gigabytes, an id dtype of 10^8 characters, a sparse .npy declaring 2e9 x 32, each refused in one line, with peak memory
measured in a child process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile

import numpy as np
import pytest

from engine.sources import SourceError, open_source

GIB = 1 << 30


def npy_header(shape: tuple[int, ...], descr: str) -> bytes:
    """A version-1.0 .npy header declaring ``shape`` of ``descr`` (the bytes after it are the test's to write)."""
    head = repr({"descr": descr, "fortran_order": False, "shape": shape}).encode()
    pad = 64 - (10 + len(head) + 1) % 64
    return b"\x93NUMPY\x01\x00" + (len(head) + pad + 1).to_bytes(2, "little") + head + b" " * pad + b"\n"


def zeros_member(archive: zipfile.ZipFile, name: str, shape: tuple[int, ...], descr: str, nbytes: int) -> None:
    """A deflated member declaring ``shape`` and holding ``nbytes`` zero bytes after its header (streamed in)."""
    with archive.open(name, "w", force_zip64=True) as out:
        out.write(npy_header(shape, descr))
        chunk = bytes(1 << 24)
        for _ in range(nbytes // len(chunk)):
            out.write(chunk)
        out.write(bytes(nbytes % len(chunk)))


def bomb_npz(path, *, ids_descr: str = "<i8", ids_shape=None, ids_bytes: int | None = None) -> str:
    n, d = 1000, 16
    rng = np.random.default_rng(0)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        with z.open("vectors.npy", "w") as out:
            np.lib.format.write_array(out, rng.standard_normal((n, d)).astype(np.float32))
        shape = ids_shape or (n,)
        zeros_member(z, "ids.npy", shape, ids_descr, ids_bytes if ids_bytes is not None else 8 * n)
    return str(path)


def test_an_id_dtype_of_huge_text_items_is_refused_from_its_header(tmp_path):
    path = bomb_npz(tmp_path / "u.npz", ids_descr="<U100000000", ids_bytes=0)
    with pytest.raises(SourceError, match=r"holds items of <U100000000 \(400,000,000 bytes each\); an id or label is at "
                                          r"most 256 characters"):
        open_source(path, what="old gallery").ids()


def test_vectors_declaring_gigabytes_from_a_few_mb_are_refused(tmp_path):
    """A real archive (1,000 random vectors, their ids) reads; a vectors member declaring 2^27 x 16 float32 (8 GiB)
    from well under 1 MB of deflated zeros is refused from its header, before its ids are allocated."""
    ok = bomb_npz(tmp_path / "ok.npz")
    assert len(open_source(ok, what="old gallery").ids()) == 1000
    path = tmp_path / "v.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        zeros_member(z, "vectors.npy", (1 << 27, 16), "<f4", 1 << 26)  # declares 8 GiB, holds 64 MB of zeros
        zeros_member(z, "ids.npy", (1 << 27,), "<i8", 0)
    assert os.path.getsize(path) < 1 << 20
    with pytest.raises(SourceError, match=r"declares 8,589,934,592 bytes from .* compressed bytes \(more than 100x"):
        open_source(f"npz:{path}", what="old gallery")


def test_a_sparse_npy_declaring_2e9_rows_is_refused(tmp_path):
    path = tmp_path / "s.npy"
    header = npy_header((2_000_000_000, 32), "<f4")
    with open(path, "wb") as f:
        f.write(header)
        f.truncate(len(header) + 2_000_000_000 * 32 * 4)  # 256 GB apparent, nothing allocated
    st = os.stat(path)
    if 512 * st.st_blocks >= st.st_size:
        pytest.skip("this filesystem allocates sparse files")
    with pytest.raises(SourceError, match="declares 256,000,000,000 bytes from"):
        open_source(f"npy:{path}", what="old gallery")


def test_a_bomb_is_refused_within_300_mb_in_a_child(tmp_path):
    """The peak resident memory of a child that opens the 8 GiB-declaring archive and reads its ids: under 300 MB
    above a bare interpreter with the engine's sources imported."""
    path = tmp_path / "v.npz"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        zeros_member(z, "vectors.npy", (1 << 27, 16), "<f4", 1 << 26)
        zeros_member(z, "ids.npy", (1 << 27,), "<i8", 1 << 26)
    code = ("import json, resource, sys\n"
            "from engine.sources import SourceError, open_source\n"
            "base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "try:\n    open_source(sys.argv[1], what='old gallery').ids(); refused = False\n"
            "except SourceError:\n    refused = True\n"
            "print(json.dumps({'refused': refused, 'peak_kb': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base}))")
    env = {**os.environ, "COMPATLAB_DATA_ROOTS": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code, f"npz:{path}"], capture_output=True, text=True, env=env,
                         check=True, cwd=os.getcwd())
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["refused"] and got["peak_kb"] < 300 * 1024


def test_a_parquet_file_declaring_gigabytes_of_zeros_is_refused_from_its_metadata(tmp_path):
    """20 million rows of 4 zero floats (320 MB decoded; a hostile file declares more, the rule is the same) run-length
    encode and zstd to a few hundred kB; the row group's metadata says so before any row is read. A real file of
    random vectors reads."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n, d = 20_000_000, 4
    zeros = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(n * d, np.float32)), d)
    pq.write_table(pa.table({"id": pa.array(np.zeros(n, np.int64)), "vector": zeros}), tmp_path / "z.parquet",
                   compression="zstd", row_group_size=n)
    assert os.path.getsize(tmp_path / "z.parquet") < 8 << 20
    with pytest.raises(SourceError, match=r"row group 0 declares 320,000,000 bytes of vectors from .* stored \(more "
                                          r"than 100x"):
        open_source(f"parquet:{tmp_path / 'z.parquet'}", what="old gallery")
    real = np.random.default_rng(0).standard_normal((1000, 8)).astype(np.float32)
    pq.write_table(pa.table({"id": np.arange(1000), "vector": pa.FixedSizeListArray.from_arrays(pa.array(real.ravel()), 8)}),
                   tmp_path / "r.parquet", compression="zstd")
    assert len(open_source(f"parquet:{tmp_path / 'r.parquet'}", what="old gallery").ids()) == 1000
