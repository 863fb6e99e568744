"""A post-hoc map applied to a whole file of new embeddings, block by block, written as .npy, .npz or Parquet.

The input is any embeddings source (:func:`engine.sources.open_source`: npz, npy, Parquet, LanceDB, Qdrant, SQL);
the output's format follows its suffix: ``.npy`` the mapped vectors (n, old_dim) float32 in reading order; ``.npz``
arrays ``ids``, ``vectors`` (and ``labels`` when the input has them), the readers' defaults; ``.parquet`` columns
``id``, ``vector`` (fixed-size list of float32) and ``label``. Memory holds one block of vectors (and, for .npz,
the ids and labels). The output is written to a temporary file in its folder and renamed: it is whole or absent.
"""
from __future__ import annotations

import os
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from engine.adapters.posthoc import PosthocMap
from engine.sources import Block, Source

OUTPUT_SUFFIXES = (".npy", ".npz", ".parquet")


def output_kind(path: Path) -> str:
    """The output format named by ``path``'s suffix; one line when it is not one of :data:`OUTPUT_SUFFIXES`."""
    if path.suffix.lower() not in OUTPUT_SUFFIXES:
        raise ValueError(f"--out {path}: the output is written as {', '.join(OUTPUT_SUFFIXES)} (by its suffix), "
                         f"not {path.suffix or 'a file without a suffix'}")
    return path.suffix.lower()[1:]


def _mapped(m: PosthocMap, source: Source, block_rows: int) -> Iterator[tuple[Block, np.ndarray]]:
    for block in source.blocks(block_rows):
        yield block, m.apply(block.vectors, block_rows=block_rows)


def _npy_header(f, shape: tuple[int, ...]) -> None:
    np.lib.format.write_array_header_2_0(f, {"descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
                                            "fortran_order": False, "shape": shape})


def _write_vectors(f, m: PosthocMap, source: Source, block_rows: int, n: int) -> Iterator[Block]:
    """Write the mapped vectors of ``source`` as one (n, old_dim) float32 .npy into ``f``, yielding each block read;
    one line when the source holds another count than ``n`` (it changed while it was read)."""
    _npy_header(f, (n, m.old_dim))
    written = 0
    for block, out in _mapped(m, source, block_rows):
        if written + len(out) > n:
            raise ValueError(f"{source.description} changed while it was read (more than {n} items)")
        f.write(np.ascontiguousarray(out, np.float32).tobytes())
        written += len(out)
        yield block
    if written != n:
        raise ValueError(f"{source.description} changed while it was read ({written} items, {n} at first)")


def _count(source: Source) -> int:
    return source.count if source.count is not None else len(source.ids())


def _write_npy(m: PosthocMap, source: Source, tmp: Path, block_rows: int) -> int:
    n = _count(source)
    with open(tmp, "wb") as f:
        for _ in _write_vectors(f, m, source, block_rows, n):
            pass
    return n


def _write_npz(m: PosthocMap, source: Source, tmp: Path, block_rows: int) -> int:
    n = _count(source)
    ids, labels = [], []
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        with zf.open("vectors.npy", "w", force_zip64=True) as f:
            for block in _write_vectors(f, m, source, block_rows, n):
                ids.append(block.ids)
                if block.labels is not None:
                    labels.append(block.labels)
        extra = {"ids": np.concatenate(ids) if ids else np.zeros(0, np.int64)}
        if labels:
            extra["labels"] = np.concatenate(labels)
        for name, arr in extra.items():
            with zf.open(f"{name}.npy", "w", force_zip64=True) as f:
                np.lib.format.write_array(f, arr, allow_pickle=False)
    return n


def _write_parquet(m: PosthocMap, source: Source, tmp: Path, block_rows: int) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    writer, n = None, 0
    try:
        for block, out in _mapped(m, source, block_rows):
            vectors = pa.FixedSizeListArray.from_arrays(pa.array(out.reshape(-1), pa.float32()), m.old_dim)
            columns = {"id": pa.array(block.ids), "vector": vectors}
            if block.labels is not None:
                columns["label"] = pa.array(block.labels)
            table = pa.table(columns)
            if writer is None:
                writer = pq.ParquetWriter(str(tmp), table.schema)
            elif table.schema != writer.schema:
                table = table.cast(writer.schema)
            writer.write_table(table)
            n += len(out)
        if writer is None:  # an empty input: an empty table with the output's columns
            empty = pa.table({"id": pa.array([], pa.int64()),
                              "vector": pa.array([], pa.list_(pa.float32(), m.old_dim))})
            pq.write_table(empty, str(tmp))
    finally:
        if writer is not None:
            writer.close()
    return n


WRITERS = {"npy": _write_npy, "npz": _write_npz, "parquet": _write_parquet}


def apply_to_file(m: PosthocMap, source: Source, out: Path, *, force: bool = False, block_rows: int = 65536) -> int:
    """Map every vector of ``source`` into the old space and write ``out`` (see the module docstring); the item count.

    An existing ``out`` is replaced only with ``force``; it must be a regular file then.
    """
    kind = output_kind(out)
    if source.dim is not None and source.dim != m.new_dim:
        raise ValueError(f"{source.description} holds {source.dim}-d vectors but the adapter maps {m.new_dim}-d ones")
    if out.exists() or out.is_symlink():
        if not force:
            raise ValueError(f"--out {out} exists; give --force to replace it")
        if not out.is_file():
            raise ValueError(f"--out {out} exists and is not a regular file; it is not replaced")
    if not out.parent.is_dir():
        raise ValueError(f"--out {out}: folder {out.parent} does not exist")
    fd, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        n = WRITERS[kind](m, source, tmp, block_rows)
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return n


__all__ = ["OUTPUT_SUFFIXES", "apply_to_file", "output_kind"]
