"""Which model made a set of vectors: a small torch-free record, stored with adapters and feature sets (issue 42).

A :class:`Fingerprint` names the model by the sha256 of its weights file when the engine knows the file, else by the
name a user declares (``--model NAME``), or by neither (only the dimension is known); with it the dimension, the
normalisation (``unit``: every row of unit L2 norm, ``raw`` otherwise, measured by :func:`normalisation_of`) and,
for text models, the prefix put before each text and the pooling. It round-trips through JSON
(:meth:`Fingerprint.to_json` / :meth:`Fingerprint.from_json`, unknown keys refused in one line).

Parquet / Arrow files and LanceDB tables may carry one in their schema's key-value metadata under
:data:`METADATA_KEY` (the JSON text); the readers report it, nothing writes to a user's store.

Two fingerprints are compared by :func:`compare`: the weights' hashes decide when both sides have one, else the
declared names when both have one; the dimension always; normalisation, prefix and pooling where both sides state
them. A comparison that no identity can decide is ``unknown`` (the caller proceeds on the dimension, saying so).
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

import numpy as np

METADATA_KEY = "compatlab.fingerprint"  # the schema metadata key of a Parquet / Arrow file or a LanceDB table
NORMALISATIONS = ("unit", "raw")
UNIT_TOLERANCE = 1e-3  # a row is of unit norm when | ||x|| - 1 | <= this
MAX_TEXT = 200  # a declared name, prefix or pooling, in characters
_SHA256 = re.compile(r"[0-9a-f]{64}")
MATCH, MISMATCH, UNKNOWN = "match", "mismatch", "unknown"


@dataclass(frozen=True)
class Fingerprint:
    """The model that made some vectors: ``sha256`` of its weights file (64 hex) and/or a declared ``name`` (both None:
    unknown), ``dim``, ``normalisation`` (``unit``, ``raw`` or None when not stated), ``prefix`` and ``pooling`` (text
    models; None when not stated)."""

    dim: int
    sha256: str | None = None
    name: str | None = None
    normalisation: str | None = None
    prefix: str | None = None
    pooling: str | None = None

    def __post_init__(self) -> None:
        if type(self.dim) is not int or not 1 <= self.dim <= 1 << 20:
            raise ValueError(f"a fingerprint's dim must be an integer in [1, {1 << 20}], got {self.dim!r}")
        if self.sha256 is not None and (not isinstance(self.sha256, str) or not _SHA256.fullmatch(self.sha256)):
            raise ValueError(f"a fingerprint's sha256 must be 64 lower-case hex digits, got {str(self.sha256)[:80]!r}")
        if self.normalisation not in (None, *NORMALISATIONS):
            raise ValueError(f"a fingerprint's normalisation must be unit or raw, got {str(self.normalisation)[:80]!r}")
        for key in ("name", "prefix", "pooling"):
            value = getattr(self, key)
            if value is not None and (not isinstance(value, str) or len(value) > MAX_TEXT
                                      or any(c in value for c in "\r\n\0")):
                raise ValueError(f"a fingerprint's {key} must be one line of at most {MAX_TEXT} characters")
        if self.name is not None and not self.name.strip():
            raise ValueError("a fingerprint's name must not be empty")

    @property
    def model(self) -> str:
        """The model as messages name it: ``name (sha256 1a2b3c4d5e6f...)``, the name, the hash, or ``an unnamed
        model``."""
        short = None if self.sha256 is None else f"sha256 {self.sha256[:12]}..."
        if self.name and short:
            return f"{self.name!r} ({short})"
        return repr(self.name) if self.name else short or "an unnamed model"

    def describe(self) -> str:
        """One phrase: ``'minilm-l6' (sha256 ...), 384-d, unit, pooling mean``."""
        parts = [self.model, f"{self.dim}-d"]
        parts += [p for p in (self.normalisation, self.pooling and f"pooling {self.pooling}",
                              self.prefix is not None and f"prefix {self.prefix!r}") if p]
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        """The fingerprint as a JSON object (every key, None as null)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: object, *, where: str = "the fingerprint") -> Fingerprint:
        """The fingerprint of a JSON object written by :meth:`to_json`; ``ValueError`` (one line naming ``where``)
        for anything else."""
        if not isinstance(data, dict):
            raise ValueError(f"{where} is a JSON {type(data).__name__}, not an object")
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(k)[:40] for k in set(data) - known)
        if unknown or "dim" not in data:
            raise ValueError(f"{where}: unexpected keys {unknown}" if unknown else f"{where} has no dim")
        try:
            return cls(**data)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{where}: {exc}") from None

    @classmethod
    def from_text(cls, text: str | bytes, *, where: str = "the fingerprint") -> Fingerprint:
        """The fingerprint of a JSON text (a file's metadata value); one line when it is not one."""
        try:
            data = json.loads(text)
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise ValueError(f"{where} is not valid JSON") from None
        return cls.from_json(data, where=where)


def normalisation_of(vectors: np.ndarray) -> str:
    """``unit`` when every row of ``vectors`` has L2 norm 1 within :data:`UNIT_TOLERANCE`, else ``raw``."""
    x = np.asarray(vectors)
    if x.ndim != 2 or not len(x):
        return "raw"
    for lo in range(0, len(x), 65536):  # a block at a time: no float64 copy of a whole feature set
        norms = np.linalg.norm(x[lo:lo + 65536].astype(np.float64), axis=1)
        if not np.all(np.abs(norms - 1.0) <= UNIT_TOLERANCE):
            return "raw"
    return "unit"


def compare(expected: Fingerprint, got: Fingerprint, *, ignore: tuple[str, ...] = ()) -> tuple[str, str]:
    """``(verdict, reason)``: :data:`MISMATCH` with the first difference (the dimension, the model, then
    normalisation, prefix, pooling unless in ``ignore``), :data:`UNKNOWN` when no identity decides (neither both
    hashes nor both names), else :data:`MATCH`."""
    if expected.dim != got.dim:
        return MISMATCH, f"{got.dim}-d vectors, not {expected.dim}-d"
    if expected.sha256 is not None and got.sha256 is not None:
        same = expected.sha256 == got.sha256
    elif expected.name is not None and got.name is not None:
        same = expected.name == got.name
    else:
        same = None
    if same is False:
        return MISMATCH, f"vectors of {got.model}, not of {expected.model}"
    for key in ("normalisation", "prefix", "pooling"):
        a, b = getattr(expected, key), getattr(got, key)
        if key not in ignore and a is not None and b is not None and a != b:
            return MISMATCH, f"{key} {b!r}, not {a!r}"
    if same is None:
        return UNKNOWN, f"{got.model} and {expected.model} share no identity to compare (no two hashes, no two names)"
    return MATCH, ""


def carried_or_declared(carried: Fingerprint | None, declared: str | None, dim: int | None, *,
                        what: str) -> Fingerprint | None:
    """The fingerprint of a store's vectors: the one it carries, named ``declared`` when it names no model; else
    ``declared`` with the dimension ``dim``; None when neither. A declared name the carried fingerprint contradicts
    is refused in one line naming ``what``."""
    if declared is not None and not declared.strip():
        raise ValueError(f"{what}: a declared model name must not be empty")
    if carried is not None:
        if declared is None or carried.name == declared:
            return carried
        if carried.name is not None:
            raise ValueError(f"{what} carries vectors of {carried.model}, not of {declared!r} as declared")
        return replace(carried, name=declared)
    if declared is None or dim is None:
        return None
    return Fingerprint(dim, name=declared)


__all__ = ["MATCH", "METADATA_KEY", "MISMATCH", "NORMALISATIONS", "UNKNOWN", "Fingerprint", "carried_or_declared", "compare",
           "normalisation_of"]
