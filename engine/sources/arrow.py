"""Parquet / Arrow files or dataset folders (local or any fsspec URL) and LanceDB tables, read as record batches.

Options: ``id=`` (default ``id``), ``vector=`` (default ``vector``; a list or fixed-size list of numbers),
``label=`` (default ``label`` when the table has it; empty: no labels). LanceDB: ``lance:DB_FOLDER#table=NAME``
or ``TABLE.lance`` inside a LanceDB folder; only read calls are made (``open_table``, a plain scan). A file's or
table's schema metadata may carry the fingerprint of the model that made its vectors under
``engine.core.fingerprint.METADATA_KEY`` (``compatlab.fingerprint``, JSON); each is read into ``fingerprint_parts``.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from engine.sources.base import Raw, Source
from engine.sources.text import (ARROW_SUFFIXES, SourceError, SourceText, check_url, first_line, is_url, local_members,
                                 local_path)


def vectors_of(column: pa.Array, *, where: str) -> np.ndarray:
    """A list / fixed-size list column as an (n, d) array; ragged or missing vectors refused."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)
            or pa.types.is_fixed_size_list(column.type)):
        raise SourceError(f"{where}: the vector column holds {column.type}, not lists of numbers")
    if column.null_count:
        raise SourceError(f"{where}: {column.null_count} items have no vector")
    n = len(column)
    if pa.types.is_fixed_size_list(column.type):
        dim = column.type.list_size
    else:
        lengths = pc.list_value_length(column).to_numpy(zero_copy_only=False)
        if n and lengths.min() != lengths.max():
            raise SourceError(f"{where}: vectors of {lengths.min()} to {lengths.max()} numbers (ragged)")
        dim = int(lengths[0]) if n else 0
    values = column.flatten()
    if values.null_count:
        raise SourceError(f"{where}: {values.null_count} vector entries are missing (null)")
    if not (pa.types.is_floating(values.type) or pa.types.is_integer(values.type)):
        raise SourceError(f"{where}: the vector column holds lists of {values.type}, not numbers")
    return values.to_numpy(zero_copy_only=False).reshape(n, dim)


class ColumnNames:
    """Which columns hold the id, the vector and the label, checked against a schema."""

    def __init__(self, text: SourceText, schema: pa.Schema, *, where: str) -> None:
        names = schema.names
        self.id, self.vector = text.option("id", "id"), text.option("vector", "vector")
        label = text.option("label")
        self.label = ("label" if "label" in names else None) if label is None else (label or None)
        for role, name in (("id", self.id), ("vector", self.vector), ("label", self.label)):
            if name is not None and name not in names:
                raise SourceError(f"{where} has no {role} column {name!r} (columns: {', '.join(names)}); "
                                  f"name it with #{role}=COLUMN")

    @property
    def columns(self) -> list[str]:
        return [c for c in (self.id, self.vector, self.label) if c is not None]

    def raw(self, batch: pa.RecordBatch, *, where: str) -> Raw:
        ids = batch.column(self.id)
        if ids.null_count:
            raise SourceError(f"{where} has {ids.null_count} items without an id")
        labels = None if self.label is None else batch.column(self.label).to_numpy(zero_copy_only=False)
        return ids.to_numpy(zero_copy_only=False), vectors_of(batch.column(self.vector), where=where), labels


def _vector_dim(schema: pa.Schema, name: str) -> int | None:
    field = schema.field(name)
    return field.type.list_size if pa.types.is_fixed_size_list(field.type) else None


MAX_INFLATION, SMALL_CHUNK = 100, 64 << 20  # the vectors may decode to 100x their stored bytes, or to 64 MiB
WIDTH = {"FLOAT": 4, "DOUBLE": 8, "INT32": 4, "INT64": 8, "INT96": 12, "BOOLEAN": 1, "FIXED_LEN_BYTE_ARRAY": 16}


def check_inflation(metadata, vector: str, *, where: str) -> None:  # pyarrow FileMetaData
    """The vector column of each row group must decode (its values x their width, from the file's own metadata) to at
    most :data:`MAX_INFLATION` x its stored bytes, or to :data:`SMALL_CHUNK`: real embeddings compress about 1.1x,
    while a file of a few hundred bytes declaring gigabytes of zeros (run-length encoded, then zstd) is refused
    before its rows, and so its ids, are read."""
    for g in range(metadata.num_row_groups):
        group = metadata.row_group(g)
        for c in range(group.num_columns):
            chunk = group.column(c)
            if chunk.path_in_schema.split(".")[0] != vector:
                continue
            decoded = chunk.num_values * WIDTH.get(chunk.physical_type, 8)
            stored = max(chunk.total_compressed_size, 1)
            if decoded > SMALL_CHUNK and decoded > MAX_INFLATION * stored:
                raise SourceError(f"{where}: row group {g} declares {decoded:,} bytes of vectors from {stored:,} stored "
                                  f"(more than {MAX_INFLATION}x: a decompression bomb, or not real values); not read")


class ArrowSource(Source):
    """A Parquet or Arrow IPC file, or a folder of them (a dataset), local or at an fsspec URL."""

    def __init__(self, text: SourceText, *, what: str, expect_dim: int | None) -> None:
        import pyarrow.dataset as ds

        super().__init__(text, what=what, expect_dim=expect_dim)
        location = text.location
        suffix = Path(location.rstrip("/")).suffix.lower()
        fmt = "ipc" if ARROW_SUFFIXES.get(suffix) == "ipc" else "parquet"
        try:
            if is_url(location):
                import fsspec

                check_url(location, what=self.description)
                fs, path = fsspec.core.url_to_fs(location)
                self.dataset = ds.dataset(path, filesystem=fs, format=fmt)
            else:
                real = local_path(location, what=what)
                if real.is_dir():  # every member resolved and confined: pyarrow is handed the checked files only
                    files = local_members(real, ARROW_SUFFIXES, what=self.description)
                    if not files:
                        raise SourceError(f"{self.description} holds no Parquet or Arrow file")
                    self.dataset = ds.dataset(files, format=fmt)
                elif real.is_file():
                    self.dataset = ds.dataset(str(real), format=fmt)
                else:
                    raise SourceError(f"{self.description} is not a regular file or a folder")
        except SourceError:
            raise
        except FileNotFoundError as exc:
            raise SourceError(f"{self.description} cannot be read: no such file or folder, or its server cannot be "
                              f"reached") from exc
        except Exception as exc:  # any reader failure becomes the one line
            raise SourceError(f"{self.description} cannot be read: {first_line(exc)}") from exc
        self.fmt = fmt
        self.names = ColumnNames(text, self.dataset.schema, where=self.description)
        if fmt == "parquet":  # every file's declared sizes, before any row is read
            import pyarrow.parquet as pq

            for path in self.dataset.files:
                with self.dataset.filesystem.open_input_file(path) as handle:
                    meta = pq.ParquetFile(handle).metadata
                    check_inflation(meta, self.names.vector, where=self.description)
                    self._note_fingerprint(Path(path).name, meta.num_rows, meta.metadata)
        else:
            self._note_fingerprint(Path(location.rstrip("/")).name, None, self.dataset.schema.metadata)
        self.count = self.dataset.count_rows()  # from the files' metadata
        dim = _vector_dim(self.dataset.schema, self.names.vector)
        if dim is None:  # a list column: the first vector tells
            first = next(self._batches([self.names.vector], 1), None)
            dim = vectors_of(first.column(0), where=self.description).shape[1] if first is not None else None
        if dim is not None:
            self._check_dim(dim)

    def _batches(self, columns: list[str], block_rows: int) -> Iterator[pa.RecordBatch]:
        """The files one after the other, a batch at a time: about a row group and a block held, no read-ahead."""
        import pyarrow.parquet as pq

        for path in self.dataset.files:
            with self.dataset.filesystem.open_input_file(path) as handle:
                if self.fmt == "parquet":
                    reader = pq.ParquetFile(handle, pre_buffer=False, buffer_size=1 << 20)
                    yield from reader.iter_batches(batch_size=block_rows, columns=columns, use_threads=False)
                    continue
                reader = pa.ipc.open_file(handle)
                for i in range(reader.num_record_batches):
                    batch = reader.get_batch(i).select(columns)
                    for start in range(0, batch.num_rows, block_rows):
                        yield batch.slice(start, block_rows)

    def _raw(self, block_rows: int) -> Iterator[Raw]:
        for batch in self._batches(self.names.columns, block_rows):
            yield self.names.raw(batch, where=self.description)

    def _raw_from(self, lo: int, block_rows: int) -> tuple[int, Iterator[Raw]]:
        """Parquet: from the row group holding row ``lo`` (the files' metadata count the rows before it, none read)."""
        if self.fmt != "parquet":
            return super()._raw_from(lo, block_rows)
        import pyarrow.parquet as pq

        seen = 0
        for f, path in enumerate(self.dataset.files):
            with self.dataset.filesystem.open_input_file(path) as handle:
                meta = pq.ParquetFile(handle).metadata
            for g in range(meta.num_row_groups):
                rows = meta.row_group(g).num_rows
                if seen + rows > lo:
                    return seen, self._raw_groups(f, g, block_rows)
                seen += rows
        return seen, iter(())

    def _raw_groups(self, first_file: int, first_group: int, block_rows: int) -> Iterator[Raw]:
        """Raw batches from row group ``first_group`` of file ``first_file`` on, to the end of the dataset."""
        import pyarrow.parquet as pq

        for f, path in enumerate(self.dataset.files[first_file:], first_file):
            with self.dataset.filesystem.open_input_file(path) as handle:
                reader = pq.ParquetFile(handle, pre_buffer=False, buffer_size=1 << 20)
                groups = list(range(first_group if f == first_file else 0, reader.metadata.num_row_groups))
                for batch in reader.iter_batches(batch_size=block_rows, row_groups=groups, columns=self.names.columns,
                                                 use_threads=False):
                    yield self.names.raw(batch, where=self.description)

    def ids(self) -> np.ndarray:
        from engine.sources.base import as_ids, join_ids

        return join_ids([as_ids(b.column(0).to_numpy(zero_copy_only=False), where=self.description)
                         for b in self._batches([self.names.id], 65536)], where=self.description)


def open_lance(text: SourceText, *, what: str, where: str) -> tuple[object, str, pa.Schema]:
    """A LanceDB table (embedded: a local folder or an object-store URI; ``#table=NAME`` or ``FOLDER/NAME.lance``)
    opened with read calls only, small caches, with its name and schema; a local folder confined to the data roots with every
    member checked. One line naming ``where`` when it cannot be."""
    try:
        import lancedb
    except ModuleNotFoundError as exc:
        raise SourceError(f"reading {where} needs the lancedb extra: pip install -e .[lancedb]") from exc
    location, name = text.location.rstrip("/"), text.option("table")
    if name is None and location.endswith(".lance"):
        location, _, stem = location.rpartition("/")
        name = stem[:-len(".lance")]
    if not name:
        raise SourceError(f"{where} names no table; add #table=NAME")
    if is_url(location):
        check_url(location, what=where)
    else:
        folder = local_path(location, what=what)
        if not folder.is_dir():
            raise SourceError(f"{where}: {folder} is not a LanceDB folder")
        local_members(folder, set(), what=where)  # no member (a table folder, a file) leads out
        location = str(folder)
    try:
        small = lancedb.Session(index_cache_size_bytes=1 << 20, metadata_cache_size_bytes=1 << 20)
        table = lancedb.connect(location, session=small).open_table(name)
        schema = table.schema
    except Exception as exc:  # a missing table or unreachable store becomes the one line
        raise SourceError(f"{where} cannot be opened: {first_line(exc)}") from exc
    return table, name, schema


def lance_batches(table, columns: list[str], block_rows: int, *, where: str) -> Iterator[pa.RecordBatch]:
    """A LanceDB table's ``columns``, a block per query (offset, limit) with small caches: one streamed scan held more
    than the table (README)."""
    start = 0
    while True:
        try:
            got = table.search().select(columns).offset(start).limit(block_rows).to_arrow()
        except Exception as exc:  # a store that went away becomes the one line
            raise SourceError(f"{where} cannot be read: {first_line(exc)}") from exc
        if got.num_rows == 0:
            return
        yield from got.to_batches()
        start += got.num_rows
        if got.num_rows < block_rows:
            return


class LanceSource(Source):
    """A LanceDB table (embedded: a local folder or an object-store URI)."""

    def __init__(self, text: SourceText, *, what: str, expect_dim: int | None) -> None:
        super().__init__(text, what=what, expect_dim=expect_dim)
        self.table, name, schema = open_lance(text, what=what, where=self.description)
        self.names = ColumnNames(text, schema, where=self.description)
        self.count = self.table.count_rows()
        self._note_fingerprint(name, self.count, schema.metadata)
        dim = _vector_dim(schema, self.names.vector)
        if dim is not None:
            self._check_dim(dim)

    def _scan(self, columns: list[str], block_rows: int) -> Iterator[pa.RecordBatch]:
        return lance_batches(self.table, columns, block_rows, where=self.description)

    def _raw(self, block_rows: int) -> Iterator[Raw]:
        for batch in self._scan(self.names.columns, block_rows):
            yield self.names.raw(batch, where=self.description)

    def ids(self) -> np.ndarray:
        from engine.sources.base import as_ids, join_ids

        return join_ids([as_ids(b.column(self.names.id).to_numpy(zero_copy_only=False), where=self.description)
                         for b in self._scan([self.names.id], 65536)], where=self.description)
