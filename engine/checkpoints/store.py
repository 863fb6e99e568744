"""Comparing checkpoints and storing the comparison: one experiment in a study of kind ``checkpoints``, written in one
transaction through ``engine.results.record``, and its JSON summary for the command line.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import Engine

from engine.checkpoints.compare import Comparison, Progress, compare_checkpoints
from engine.checkpoints.evaluate_folder import result_json
from engine.checkpoints.files import LOCAL, Trust
from engine.checkpoints.request import ComparisonSpec
from engine.results.record import NewVersion, record_experiment


def comparison_config(cmp: Comparison) -> dict[str, Any]:
    """What is stored as the experiment's config: the spec plus what was found in the files."""
    models = [{"label": label, "path": str(m.path.resolve()), "sha256": m.sha256, "kind": m.kind,
               "architecture": m.architecture, "num_outputs": m.num_outputs,
               "feature_dim": int(out["gallery"]["encoder"].shape[1])}
              for label, m, out in zip(cmp.labels, cmp.models, cmp.outputs)]
    return {"source": "checkpoints", "spec": cmp.spec.to_dict(), "models": models, "protocol": cmp.protocol_name,
            "same_set": cmp.same_set, "dataset_classes": list(cmp.dataset_classes), "shared_classes": cmp.shared.tolist(),
            "notes": cmp.notes}


def store_comparison(db: Engine, cmp: Comparison) -> int:
    """Write the comparison as one experiment, in a study of kind ``checkpoints``, in one transaction; return its id."""
    config = comparison_config(cmp)
    versions = [NewVersion(architecture=model.architecture, method="checkpoints", classes=range(len(names)),
                        num_outputs=len(names), feature_dim=int(out["gallery"]["encoder"].shape[1]),
                        outputs=out, labels=cmp.split_labels,  # a logits-only TorchScript model stores no encoder view
                        class_names=names, checkpoint_path=str(model.path.resolve()), name=source.label,
                        refs=cmp.refs, weights_sha256=model.sha256 or None, pooling=getattr(model, "pooling", None))
                for model, names, out, source in zip(cmp.models, cmp.class_names, cmp.outputs, cmp.spec.models)]
    return record_experiment(db, name=(cmp.spec.name or "checkpoints: " + " -> ".join(cmp.labels))[:200],
                             method="checkpoints", config=config, versions=versions, results=cmp.results,
                             gallery_kind=cmp.spec.gallery_kind, ties=cmp.spec.ties, study_kind="checkpoints")


def comparison_json(cmp: Comparison, experiment_id: int | None = None) -> dict[str, Any]:
    """JSON-ready summary: per view the matrices, AC/AA/ACA and counts (as ``evaluate --json``), plus notes."""
    return {
        "experiment_id": experiment_id,
        "models": comparison_config(cmp)["models"],
        "dataset": cmp.spec.dataset or {"query": cmp.spec.query_dataset, "gallery": cmp.spec.gallery_dataset},
        "protocol": cmp.protocol_name,
        "gallery_kind": cmp.spec.gallery_kind,
        "same_set": cmp.same_set,
        "shared_classes": [[None if v < 0 else int(v) for v in row] for row in cmp.shared],
        "views": {view: {"comparable": r.comparable.tolist(), "metrics": result_json(r, ecc_ties=cmp.spec.ties)}
                  for view, r in cmp.results.items()},
        "notes": cmp.notes,
    }


def run_checkpoint_comparison(db: Engine, spec: Mapping[str, Any] | ComparisonSpec, *, progress: Progress | None = None,
                              should_stop: Callable[[], bool] | None = None, trust: Trust = LOCAL) -> int:
    """Compare the checkpoints of a JSON-able ``spec`` (see :func:`comparison_spec`) and store; return the experiment id."""
    cmp = compare_checkpoints(spec, progress=progress, should_stop=should_stop, trust=trust)
    experiment_id = store_comparison(db, cmp)
    if progress is not None:
        progress(1.0, f"stored as experiment {experiment_id}")
    return experiment_id
