"""The database schema (SQLAlchemy 2 declarative). Portable: SQLite by default, PostgreSQL later."""
from __future__ import annotations

from datetime import datetime
from typing import Any

import numpy as np
from sqlalchemy import (
    JSON,
    Boolean,
    CheckConstraint,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from storage.types import NpyArray, UTCDateTime, utcnow

EXPERIMENT_STATUSES = ("queued", "running", "done", "failed", "cancelled")
JOB_STATUSES = EXPERIMENT_STATUSES
FINISHED_STATUSES = ("done", "failed", "cancelled")
# Columns added after the first release: ``init_db`` adds them to an existing database (storage.migrate).
ADDED_COLUMNS = (
    ("jobs", "lease"),
    ("jobs", "payload_hash"),
    ("model_versions", "name"),
    ("feature_sets", "image_source"),
    ("feature_sets", "store_uri"),
    ("feature_sets", "store_key"),
    ("feature_sets", "store_layout"),
    ("jobs", "worker_host"),
    ("jobs", "worker_boot_id"),
    ("feature_sets", "fingerprint"),
    ("source_checks", "trec_zip"),
)
SPLITS = ("query", "gallery", "train")
GALLERY_KINDS = ("instance", "template")  # what a gallery item is (engine.core.vocab.GALLERY_KINDS)
MAX_MODEL_NAME = 40
MAX_NAME = 200  # experiment and study names (their columns' length)


def _one_of(column: str, values: tuple[str, ...]) -> CheckConstraint:
    allowed = ", ".join(f"'{value}'" for value in values)
    return CheckConstraint(f"{column} IN ({allowed})", name=f"{column}_allowed")


class Base(DeclarativeBase):
    """Declarative base with a naming convention so constraints have stable names on every backend."""

    metadata = MetaData(
        naming_convention={
            "ix": "ix_%(column_0_label)s",
            "uq": "uq_%(table_name)s_%(column_0_name)s",
            "ck": "ck_%(table_name)s_%(constraint_name)s",
            "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
            "pk": "pk_%(table_name)s",
        }
    )


def _created_at() -> Mapped[datetime]:
    return mapped_column(UTCDateTime, default=utcnow, nullable=False)


def _experiment_fk() -> Mapped[int]:
    return mapped_column(ForeignKey("experiments.id", ondelete="CASCADE"), index=True, nullable=False)


def _children() -> dict[str, Any]:
    """Cascade settings for rows owned by their parent: the database deletes them (ON DELETE CASCADE)."""
    return {"cascade": "all, delete-orphan", "passive_deletes": True}


class Study(Base):
    """Experiments run side by side (e.g. methods compared on one scenario)."""

    __tablename__ = "studies"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(MAX_NAME))
    kind: Mapped[str] = mapped_column(String(50))  # "compare", "checkpoints", ...
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    created_at: Mapped[datetime] = _created_at()

    experiments: Mapped[list[Experiment]] = relationship(back_populates="study", passive_deletes=True)


class Experiment(Base):
    """One run of one method on one scenario; its ``config_hash`` lets the engine reuse finished runs."""

    __tablename__ = "experiments"
    __table_args__ = (_one_of("status", EXPERIMENT_STATUSES),)

    id: Mapped[int] = mapped_column(primary_key=True)
    study_id: Mapped[int | None] = mapped_column(ForeignKey("studies.id", ondelete="SET NULL"), index=True)
    name: Mapped[str] = mapped_column(String(MAX_NAME))
    method: Mapped[str] = mapped_column(String(100))
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    config_hash: Mapped[str] = mapped_column(String(128), index=True)
    status: Mapped[str] = mapped_column(String(20), default="queued")
    created_at: Mapped[datetime] = _created_at()
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    error: Mapped[str | None] = mapped_column(Text)

    study: Mapped[Study | None] = relationship(back_populates="experiments")
    model_versions: Mapped[list[ModelVersion]] = relationship(
        back_populates="experiment", order_by="ModelVersion.step", **_children()
    )
    matrices: Mapped[list[CompatibilityMatrix]] = relationship(back_populates="experiment", **_children())
    analyses: Mapped[list[Analysis]] = relationship(back_populates="experiment", **_children())


class ModelVersion(Base):
    """The model after training step ``step`` (1-based) of an experiment."""

    __tablename__ = "model_versions"
    __table_args__ = (
        UniqueConstraint("experiment_id", "step"),
        CheckConstraint("step >= 1", name="step_positive"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = _experiment_fk()
    step: Mapped[int] = mapped_column(Integer)
    architecture: Mapped[str] = mapped_column(String(100))
    method: Mapped[str] = mapped_column(String(100))
    classes: Mapped[list[int]] = mapped_column(JSON)  # classes this version was trained on
    num_outputs: Mapped[int] = mapped_column(Integer)
    class_names: Mapped[list[str] | None] = mapped_column(JSON(none_as_null=True))
    checkpoint_path: Mapped[str | None] = mapped_column(String(1000))
    feature_dim: Mapped[int] = mapped_column(Integer)
    replaced: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = _created_at()
    name: Mapped[str | None] = mapped_column(String(MAX_MODEL_NAME))  # the user's name (v1, v2, ...); None: "step N"

    experiment: Mapped[Experiment] = relationship(back_populates="model_versions")
    feature_sets: Mapped[list[FeatureSet]] = relationship(back_populates="model_version", **_children())


class FeatureSet(Base):
    """Features of one split under one view (encoder, logits, psp, "F(old)", ...) of one model version."""

    __tablename__ = "feature_sets"
    __table_args__ = (UniqueConstraint("model_version_id", "split", "view"), _one_of("split", SPLITS))

    id: Mapped[int] = mapped_column(primary_key=True)
    model_version_id: Mapped[int] = mapped_column(
        ForeignKey("model_versions.id", ondelete="CASCADE"), index=True, nullable=False
    )
    split: Mapped[str] = mapped_column(String(20))
    view: Mapped[str] = mapped_column(String(100))
    features: Mapped[np.ndarray] = mapped_column(NpyArray)
    labels: Mapped[np.ndarray] = mapped_column(NpyArray)
    image_ids: Mapped[np.ndarray | None] = mapped_column(NpyArray)
    dim: Mapped[int] = mapped_column(Integer)
    count: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = _created_at()  # when the current contents were written

    model_version: Mapped[ModelVersion] = relationship(back_populates="feature_sets")
    # where the rows' images come from (engine.data.samples): ``image_ids[i]`` indexes this source; None: unknown
    image_source: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    # storage.featurestore: where the arrays live when not in the blobs above (None: a blob row, as before the store)
    store_uri: Mapped[str | None] = mapped_column(String(1000))
    store_key: Mapped[str | None] = mapped_column(String(500))
    store_layout: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))
    # which model made the vectors (engine.core.fingerprint.Fingerprint as JSON); None: a set stored before fingerprints
    fingerprint: Mapped[dict[str, Any] | None] = mapped_column(JSON(none_as_null=True))


class CompatibilityMatrix(Base):
    """A T x T matrix of one metric: row = query model step, column = gallery model step (NaN where undefined)."""

    __tablename__ = "compatibility_matrices"
    __table_args__ = (
        UniqueConstraint("experiment_id", "metric", "protocol", "view", "eval_classes"),
        _one_of("protocol", GALLERY_KINDS),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = _experiment_fk()
    metric: Mapped[str] = mapped_column(String(50))  # "recall@1", "map", ...
    gallery_kind: Mapped[str] = mapped_column("protocol", String(20))  # the column keeps its first name: no migration
    view: Mapped[str] = mapped_column(String(100))
    eval_classes: Mapped[str] = mapped_column(String(100), default="all")
    values: Mapped[np.ndarray] = mapped_column(NpyArray)  # float64
    valid_queries: Mapped[np.ndarray] = mapped_column(NpyArray)  # int, per cell
    no_positive: Mapped[np.ndarray] = mapped_column(NpyArray)  # int, per cell
    summary: Mapped[dict[str, Any]] = mapped_column(JSON)  # AC, AA, ACA, ...
    created_at: Mapped[datetime] = _created_at()

    experiment: Mapped[Experiment] = relationship(back_populates="matrices")


class Analysis(Base):
    """A cached worker-computed result (2-D map, backfill curve, geometry report) keyed by (kind, key)."""

    __tablename__ = "analyses"
    __table_args__ = (UniqueConstraint("experiment_id", "kind", "key"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    experiment_id: Mapped[int] = _experiment_fk()
    kind: Mapped[str] = mapped_column(String(50))  # "projection", "backfill", "geometry", ...
    key: Mapped[str] = mapped_column(String(500))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    array: Mapped[np.ndarray | None] = mapped_column(NpyArray)
    created_at: Mapped[datetime] = _created_at()

    experiment: Mapped[Experiment] = relationship(back_populates="analyses")


class Job(Base):
    """A unit of work for the engine worker, enqueued by the app."""

    __tablename__ = "jobs"
    __table_args__ = (
        _one_of("status", JOB_STATUSES),
        CheckConstraint("progress >= 0 AND progress <= 1", name="progress_range"),
    )

    id: Mapped[int] = mapped_column(primary_key=True)
    kind: Mapped[str] = mapped_column(String(50))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    payload_hash: Mapped[str | None] = mapped_column(String(64))  # storage.jobs.payload_hash: finds identical launches
    status: Mapped[str] = mapped_column(String(20), default="queued", index=True)
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    message: Mapped[str] = mapped_column(Text, default="")
    error: Mapped[str | None] = mapped_column(Text)
    experiment_id: Mapped[int | None] = mapped_column(ForeignKey("experiments.id", ondelete="SET NULL"), index=True)
    study_id: Mapped[int | None] = mapped_column(ForeignKey("studies.id", ondelete="SET NULL"), index=True)
    worker_pid: Mapped[int | None] = mapped_column(Integer)
    worker_host: Mapped[str | None] = mapped_column(String(200))  # with worker_boot_id and worker_pid: who claimed it
    worker_boot_id: Mapped[str | None] = mapped_column(String(64))  # (storage.identity)
    lease: Mapped[str | None] = mapped_column(String(64))  # fresh random token per claim; see storage.jobs
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    created_at: Mapped[datetime] = _created_at()
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


# Kinds of the jobs the removed task layer wrote (a matrix's cells, an extraction; "cell" for both before they took
# their tasks' kind): a database from then still lists them; no worker runs or retries them. Their ``tasks`` table
# and ``jobs.lease_until`` column stay in such a database, unmapped and unread (tests/test_old_task_database.py).
LEGACY_TASK_JOB_KIND = "cell"
TASK_JOB_KINDS = ("search", "extract", LEGACY_TASK_JOB_KIND)


class SourceCheck(Base):
    """An upgrade check on embeddings read from sources (a ``sources_check`` job), keyed by its job's payload hash."""

    __tablename__ = "source_checks"

    id: Mapped[int] = mapped_column(primary_key=True)
    key: Mapped[str] = mapped_column(String(64), unique=True)  # storage.jobs.payload_hash of the job that computed it
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)  # engine.upgrade.from_sources.SourcesCheck.to_json()
    # the check's TREC run files and qrels in one zip (engine.results.trec.zip_files), read only when downloaded;
    # None: stored before they were kept, or an id a TREC file cannot hold (the payload's "trec" says why)
    trec_zip: Mapped[bytes | None] = mapped_column(LargeBinary, deferred=True)
    created_at: Mapped[datetime] = _created_at()
