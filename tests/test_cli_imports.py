"""A check from vectors starts like a command-line tool: ``check-upgrade`` on stored vectors loads no torch.

Each command runs in a fresh interpreter (``python -m engine ...``, the way a CI gate runs it) that lists ``sys.modules``
when it exits: ``check-upgrade --features DIR`` (with and without ``--plan``), ``check-upgrade --old-gallery ...`` on
``.npz`` queries and Parquet galleries (labels with ``--plan``; qrels), and ``adapter fit`` / ``adapter apply`` of a
post-hoc map on those sources. None may load torch, torchvision, faiss, UMAP, scikit-learn, the model code
(``engine.models``) or the modules that load checkpoints or train paper 004's adapters; the numbers themselves are
checked elsewhere (tests/test_upgrade_cli.py, tests/test_upgrade_sources.py, tests/test_upgrade_plan_cli.py).
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "torchvision", "faiss", "umap", "sklearn", "engine.models", "engine.checkpoints.loading",
         "engine.checkpoints.tensors", "engine.checkpoints.torch_zip", "engine.checkpoints.sandbox",
         "engine.checkpoints.compare", "engine.checkpoints.embedding", "engine.adapters.fit", "engine.adapters.pair")
EXIT_AT = ("import atexit, json, runpy, sys\n"
           "atexit.register(lambda: print('MODULES ' + json.dumps(sorted(sys.modules)), file=sys.stderr))\n"
           "sys.argv = ['engine', *sys.argv[1:]]\n"
           "runpy.run_module('engine', run_name='__main__', alter_sys=True)\n")
NQ, NG, DIM, CLASSES = 40, 90, 12, 4


def run_fresh(*argv: str) -> tuple[int, str, list[str]]:
    """``python -m engine ARGV`` in a new interpreter: exit code, stdout, and the modules loaded when it exited."""
    done = subprocess.run([sys.executable, "-c", EXIT_AT, *argv], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    lines = [line for line in done.stderr.splitlines() if line.startswith("MODULES ")]
    assert lines, done.stderr
    return done.returncode, done.stdout, json.loads(lines[-1][len("MODULES "):])


def heavy(modules: list[str]) -> list[str]:
    """The entries of :data:`HEAVY` that ``modules`` hold (a package or any of its submodules)."""
    return [h for h in HEAVY if any(m == h or m.startswith(h + ".") for m in modules)]


@pytest.fixture(scope="module")
def vectors() -> dict[str, np.ndarray]:
    """Old and new embeddings of the same items and queries: class centres plus noise, new = old slightly rotated."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(CLASSES, DIM))
    q_labels, g_labels = rng.integers(0, CLASSES, NQ), rng.integers(0, CLASSES, NG)
    q = centres[q_labels] + 0.8 * rng.normal(size=(NQ, DIM))
    g = centres[g_labels] + 0.8 * rng.normal(size=(NG, DIM))
    turn, r = np.linalg.qr(np.eye(DIM) + 0.3 * rng.normal(size=(DIM, DIM)))
    turn *= np.sign(np.diag(r))
    return {"q_labels": q_labels, "g_labels": g_labels, "old_queries": q.astype(np.float32),
            "old_gallery": g.astype(np.float32), "new_queries": (q @ turn).astype(np.float32),
            "new_gallery": (g @ turn).astype(np.float32)}


@pytest.fixture(scope="module")
def files(tmp_path_factory, vectors) -> Path:
    """A features folder (step_1.npz old, step_2.npz new) and sources: .npz queries, Parquet galleries, BEIR qrels."""
    root = tmp_path_factory.mktemp("check")
    (root / "features").mkdir()
    for step, side in ((1, "old"), (2, "new")):
        np.savez(root / "features" / f"step_{step}.npz", query_features=vectors[f"{side}_queries"],
                 query_labels=vectors["q_labels"], gallery_features=vectors[f"{side}_gallery"],
                 gallery_labels=vectors["g_labels"])
        np.savez(root / f"{side}_queries.npz", ids=np.arange(NQ), vectors=vectors[f"{side}_queries"],
                 labels=vectors["q_labels"])
        pq.write_table(pa.table({"id": np.arange(NG), "vector": list(vectors[f"{side}_gallery"]),
                                 "label": vectors["g_labels"]}), root / f"{side}_gallery.parquet")
    judged = [f"{qi}\t{gi}\t1" for qi in range(NQ) for gi in np.flatnonzero(vectors["g_labels"] == vectors["q_labels"][qi])[:3]]
    (root / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(judged) + "\n")
    return root


def sources(root: Path) -> list[str]:
    return ["--data-root", str(root), "--old-gallery", str(root / "old_gallery.parquet"), "--new-gallery",
            str(root / "new_gallery.parquet"), "--old-queries", str(root / "old_queries.npz"), "--new-queries",
            str(root / "new_queries.npz")]


@pytest.mark.parametrize("name, argv", [
    ("features", lambda root: ["--features", str(root / "features")]),
    ("features, --plan", lambda root: ["--features", str(root / "features"), "--data-root", str(root),
                                       "--plan", str(root / "features-plan")]),
    ("sources, labels, --plan", lambda root: [*sources(root), "--plan", str(root / "sources-plan")]),
    ("sources, qrels", lambda root: [*sources(root), "--qrels", str(root / "qrels.tsv")]),
])
def test_check_upgrade_from_vectors_loads_no_torch(files, name, argv):
    code, out, modules = run_fresh("check-upgrade", *argv(files))
    assert code in (0, 1, 3), out
    assert "compatibility diff" in out and ("plan:" in out) == ("--plan" in name)
    assert heavy(modules) == [], f"check-upgrade ({name}) loaded {heavy(modules)}"
    assert "numpy" in modules and "engine.upgrade.verdict" in modules  # the check itself ran


def test_a_post_hoc_adapter_fitted_and_applied_on_sources_loads_no_torch(files):
    code, out, modules = run_fresh("adapter", "fit", "--data-root", str(files), "--old", str(files / "old_gallery.parquet"),
                                   "--new", str(files / "new_gallery.parquet"), "--held-out", "30", "--kind", "procrustes",
                                   "--pairs", "60", "--resamples", "50", "--no-onnx", "--out", str(files / "adapter"))
    assert code == 0, out
    assert heavy(modules) == [], f"adapter fit loaded {heavy(modules)}"
    code, out, modules = run_fresh("adapter", "apply", "--data-root", str(files), "--adapter", str(files / "adapter"),
                                   "--in", str(files / "new_queries.npz"), "--out", str(files / "adapted.npy"))
    assert code == 0, out
    assert heavy(modules) == [], f"adapter apply loaded {heavy(modules)}"
    assert np.load(files / "adapted.npy").shape == (NQ, DIM)
