"""The dashboard's nearest neighbours (engine.analysis.neighbours) load no torch, torchvision, numba or faiss.

``app.queries.neighbours`` calls ``nearest_neighbours`` in the Streamlit process: a fresh interpreter imports
it and calls it on a tiny stored experiment (the encoder view and PSP, whose projection is numpy), then reads
``sys.modules``. The neighbours it returns are checked against cosines worked out by hand.
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from storage import add_model_version, create_experiment, get_engine, init_db, save_feature_set, session_scope

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "torchvision", "numba", "faiss")


def _tiny_experiment(url: str) -> tuple[int, int]:
    """An open-set experiment: gallery model (step 1, classes c0 c1), query model (step 2, classes c0 c1 c2).

    Query row 0 (label 0): encoder (1, 0); softmax (0.6, 0.3, 0.1), whose PSP on c0, c1 is (1, -1) / sqrt 2.
    Gallery (labels 0 1 0 1): encoders (1, 0), (0, 1), (0.9, 0.1), (-1, 0), cosines to the query 1, 0,
    0.9 / sqrt(0.82), -1; softmaxes whose PSP is (1, -1) / sqrt 2 for rows 0, 2 and (-1, 1) / sqrt 2 for rows 1, 3.
    """
    db = get_engine(url)
    init_db(db)
    g_labels = np.array([0, 1, 0, 1])
    g_enc = np.array([[1.0, 0.0], [0.0, 1.0], [0.9, 0.1], [-1.0, 0.0]], np.float32)
    g_soft = np.array([[0.75, 0.25], [0.25, 0.75], [0.625, 0.375], [0.375, 0.625]], np.float32)  # exact: ties are ties
    q_labels = np.array([0, 2])
    q_enc = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    q_soft = np.array([[0.6, 0.3, 0.1], [0.1, 0.1, 0.8]], np.float32)
    with session_scope(db) as s:
        exp = create_experiment(s, name="tiny", method="bct", config={"same_set": False}, config_hash="tiny")
        old = add_model_version(s, exp.id, 1, architecture="mlp", method="bct", classes=[0, 1], num_outputs=2,
                                feature_dim=2, class_names=["c0", "c1"])
        new = add_model_version(s, exp.id, 2, architecture="mlp", method="bct", classes=[0, 1, 2], num_outputs=3,
                                feature_dim=2, class_names=["c0", "c1", "c2"])
        for split in ("query", "gallery"):
            save_feature_set(s, old.id, split, "encoder", g_enc, g_labels)
            save_feature_set(s, old.id, split, "softmax", g_soft, g_labels)
            save_feature_set(s, new.id, split, "encoder", q_enc, q_labels)
            save_feature_set(s, new.id, split, "softmax", q_soft, q_labels)
        return new.id, old.id


def test_nearest_neighbours_load_no_heavy_module(db_url):
    query_id, gallery_id = _tiny_experiment(db_url)
    code = (
        "import json, sys\n"
        "from engine.analysis.neighbours import nearest_neighbours\n"
        "from storage import get_engine\n"
        f"db = get_engine({db_url!r})\n"
        f"out = {{view: nearest_neighbours(db, {query_id}, {gallery_id}, view, 0, k=3)\n"
        "       for view in ('encoder', 'psp')}\n"
        f"print(json.dumps({{'heavy': [m for m in {HEAVY!r} if m in sys.modules], 'out': out}}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["heavy"] == [], f"nearest_neighbours loaded {result['heavy']}"

    encoder, psp = result["out"]["encoder"], result["out"]["psp"]
    assert [n["gallery_index"] for n in encoder["neighbours"]] == [0, 2, 1]
    assert [n["hit"] for n in encoder["neighbours"]] == [True, True, False]
    cosines = [1.0, 0.9 / math.sqrt(0.82), 0.0]
    assert [n["similarity"] for n in encoder["neighbours"]] == pytest.approx(cosines, abs=1e-6)
    assert encoder["query"] == {"index": 0, "label": 0, "name": "c0", "image_id": None}
    assert (encoder["n_gallery"], encoder["n_positives"], encoder["same_set"]) == (4, 2, False)
    # PSP on the gallery model's two classes: +-1 cosines, ties kept in row order
    psp_top = [(n["gallery_index"], round(n["similarity"], 6)) for n in psp["neighbours"]]
    assert psp_top == [(0, 1.0), (2, 1.0), (1, -1.0)]
    assert (psp["query_step"], psp["gallery_step"]) == (2, 1)
