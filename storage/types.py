"""Column types: numpy arrays as ``.npy`` bytes (no pickle) and timezone-aware UTC datetimes."""
from __future__ import annotations

import io
from datetime import datetime, timezone
from typing import Any

import numpy as np
from sqlalchemy import DateTime, LargeBinary
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator


def utcnow() -> datetime:
    """The current time as a timezone-aware UTC datetime."""
    return datetime.now(timezone.utc)


def storable_array(value: Any) -> np.ndarray:
    """``value`` as an array that can be stored without pickle; ``ValueError`` for object dtypes."""
    array = np.asarray(value)
    if array.dtype.hasobject:
        raise ValueError(
            f"cannot store an array of dtype {array.dtype}: object arrays need pickle, which the database "
            "never uses; convert it to a numeric, bool or fixed-width string dtype first"
        )
    return array


def array_to_npy(value: Any) -> bytes:
    """Serialise an array to ``.npy`` bytes without pickle; object arrays raise ``ValueError``."""
    array = storable_array(value)
    buffer = io.BytesIO()
    try:
        np.save(buffer, array, allow_pickle=False)
    except ValueError as exc:  # e.g. numpy's variable-width StringDType
        raise ValueError(
            f"cannot store an array of dtype {array.dtype} without pickle; convert it to a numeric, bool "
            "or fixed-width string dtype first"
        ) from exc
    return buffer.getvalue()


def npy_to_array(data: bytes) -> np.ndarray:
    """Load ``.npy`` bytes written by :func:`array_to_npy` (pickle refused)."""
    return np.load(io.BytesIO(data), allow_pickle=False)


class NpyArray(TypeDecorator[np.ndarray]):
    """A numpy array stored as ``.npy`` bytes; round-trips dtype, shape and every bit (NaN, -0.0, inf)."""

    impl = LargeBinary
    cache_ok = True

    def process_bind_param(self, value: Any, dialect: Dialect) -> bytes | None:
        return None if value is None else array_to_npy(value)

    def process_result_value(self, value: bytes | None, dialect: Dialect) -> np.ndarray | None:
        return None if value is None else npy_to_array(bytes(value))


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and always read back timezone-aware (SQLite keeps no offset)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value!r}: pass a timezone-aware one, e.g. datetime.now(timezone.utc)")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value.astimezone(timezone.utc)
