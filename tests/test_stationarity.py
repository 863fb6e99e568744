"""The stationarity probe: hand-computed values, the geometry analysis storing it, the Geometry page showing it."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from engine.jobs.analysis import run_analysis
from engine.core.config import RunConfig
from engine.core.contract import analysis_key
from engine.models import build_model, save_checkpoint
from engine.analysis.stationarity import (
    assigned_centroid,
    energy_fraction,
    prototype_cosines,
    stationarity_probe,
    turn_angle,
)
from storage import (
    add_model_version,
    create_experiment,
    create_study,
    get_engine,
    init_db,
    load_analysis,
    save_feature_set,
    session_scope,
    set_experiment_status,
)

S3 = math.sqrt(3)
# a centred 2-D simplex of 3 unit prototypes, at 90, 210 and 330 degrees
SIMPLEX_2D = np.array([[0.0, 1.0], [-S3 / 2, -0.5], [S3 / 2, -0.5]])


# ------------------------------------------------------------------------------------------ pure functions


def test_hand_computed_2d_probe():
    features = np.array([[0.0, 2.0], [1.0, 1.0], [-1.5 * S3, -1.5], [5.0, 5.0]])
    labels = np.array([0, 0, 1, 2])  # the class-2 sample is not assigned yet: it must not count
    probe, u = stationarity_probe(features, labels, SIMPLEX_2D, [0, 1])
    # cosines 1, 1/sqrt(2), 1
    assert probe["prototype_cosine"] == pytest.approx((2 + 1 / math.sqrt(2)) / 3)
    # centroid of prototypes 0 and 1: (-sqrt3/4, 1/4), unit (-sqrt3/2, 1/2), at 150 degrees
    assert u == pytest.approx([-S3 / 2, 0.5])
    # projections 1, (1 - sqrt3)/2, 3/2; squared norms 4, 2, 9
    assert probe["centroid_energy"] == pytest.approx((1 + (1 - S3 / 2) + 9 / 4) / 15)
    u1 = assigned_centroid(SIMPLEX_2D, [0])
    assert u1 == pytest.approx([0.0, 1.0])
    assert turn_angle(u1, u) == pytest.approx(60.0)  # 90 -> 150 degrees
    # all three assigned: the centred simplex's centroid vanishes, no direction and no turn
    everything, none = stationarity_probe(features, labels, SIMPLEX_2D, [0, 1, 2])
    assert none is None and everything["centroid_energy"] is None
    assert turn_angle(u, none) is None


def test_energy_fraction_extremes_and_3d():
    u = np.array([0.0, 0.0, 1.0])
    assert energy_fraction(np.array([[0, 0, 3.0], [0, 0, -2.0]]), u) == pytest.approx(1.0)
    assert energy_fraction(np.array([[1.0, 2.0, 0.0]]), u) == pytest.approx(0.0)
    # (1,1,1): 1 of 3 units of energy along z; (0,3,4): 16 of 25
    assert energy_fraction(np.array([[1.0, 1, 1], [0, 3, 4]]), u) == pytest.approx(17 / 28)


def test_cosines_match_torch():
    rng = np.random.default_rng(0)
    features, prototypes = rng.normal(size=(50, 7)), rng.normal(size=(5, 7))
    labels = rng.integers(0, 5, size=50)
    expected = F.cosine_similarity(torch.from_numpy(features), torch.from_numpy(prototypes[labels]), dim=1).numpy()
    assert prototype_cosines(features, labels, prototypes) == pytest.approx(expected)


@pytest.mark.parametrize("call, message", [
    (lambda: prototype_cosines(np.ones((2, 3)), np.zeros(2, int), np.ones((2, 2))), "do not match 3-d features"),
    (lambda: prototype_cosines(np.ones((2, 2)), np.array([0, 4]), np.ones((3, 2))), "only 3 prototypes"),
    (lambda: assigned_centroid(np.ones((3, 2)), [5]), "must be non-empty rows"),
    (lambda: stationarity_probe(np.ones((2, 2)), np.array([2, 2]), SIMPLEX_2D, [0, 1]), "no sample belongs"),
    (lambda: energy_fraction(np.ones((2, 2)), np.ones(3)), r"a \(D,\) direction"),
])
def test_bad_inputs_say_what_is_wrong(call, message):
    with pytest.raises(ValueError, match=message):
        call()


# ------------------------------------------------------------------------------------------ stored with the geometry

K = 4  # d-Simplex of 4 classes: 3-d features
PER_CLASS = 10


def store_probe_study(db_url: str, folder) -> dict:
    """A finished study: ``cores`` (d-Simplex checkpoints, 2 -> 3 -> 4 classes), ``bct`` (linear head) and
    ``independent`` without checkpoints; the geometry analysis computed for each."""
    db = get_engine(db_url)
    init_db(db)
    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(K), PER_CLASS)
    simplex = build_model(backbone="small_cnn", head="dsimplex", num_classes=K, in_channels=1, width=8)
    linear = build_model(backbone="small_cnn", head="linear", num_classes=K, in_channels=1, width=8, feature_dim=3)
    paths = {"cores": folder / "simplex.safetensors", "bct": folder / "linear.safetensors"}
    save_checkpoint(simplex, paths["cores"])
    save_checkpoint(linear, paths["bct"])
    protos = simplex.head.weight.double().numpy()
    features = {1: 2.0 * protos[labels],  # exactly on the prototypes
                2: protos[labels] + 0.4 * rng.normal(size=(len(labels), 3)),
                3: protos[labels] + 0.2 * rng.normal(size=(len(labels), 3))}
    cfg = RunConfig(name="probe", methods=("cores", "bct", "independent"))
    out = {"features": features, "labels": labels, "prototypes": protos,
           "linear_rows": linear.head.weight.detach().double().numpy(), "experiments": {}}
    with session_scope(db) as s:
        study = create_study(s, name="probe", kind="compare", config=cfg.to_dict())
        for method in cfg.methods:
            exp = create_experiment(s, name=f"probe/{method}", method=method, config=cfg.for_method(method).to_dict(),
                                    config_hash=f"probe-{method}", study_id=study.id)
            out["experiments"][method] = exp.id
            for t, seen in ((1, 2), (2, 3), (3, 4)):
                mv = add_model_version(s, exp.id, t, architecture="small_cnn", method=method,
                                       classes=list(range(seen)), num_outputs=K, feature_dim=3,
                                       class_names=[f"class-{c}" for c in range(seen)],
                                       checkpoint_path=str(paths[method]) if method in paths else None)
                logits = (features[t] @ protos.T).astype(np.float32)
                for split in ("query", "gallery"):
                    save_feature_set(s, mv.id, split, "encoder", features[t].astype(np.float32), labels)
                    save_feature_set(s, mv.id, split, "logits", logits, labels)
                    save_feature_set(s, mv.id, split, "softmax", torch.softmax(torch.from_numpy(logits), 1).numpy(),
                                     labels)
            set_experiment_status(s, exp.id, "done")
    for exp_id in out["experiments"].values():
        run_analysis(db, exp_id, "geometry", {"view": "encoder", "split": "gallery"})
    return out


def _stored_probe(db_url: str, exp_id: int) -> list[dict]:
    with session_scope(get_engine(db_url)) as s:
        row = load_analysis(s, exp_id, "geometry", analysis_key("geometry", {"view": "encoder"}))
        return row.payload["stationarity"]


def test_geometry_analysis_stores_the_probe_per_step(db_url, tmp_path):
    study = store_probe_study(db_url, tmp_path)
    labels, protos = study["labels"], study["prototypes"]
    first, second, third = _stored_probe(db_url, study["experiments"]["cores"])
    assert [r["step"] for r in (first, second, third)] == [1, 2, 3]
    assert {r["prototypes"] for r in (first, second, third)} == {"fixed"}
    # step 1: features are 2 x their unit prototype: cosine 1; unit rows at cos -1/3 give (p_y . u)^2 = 1/3
    assert first["prototype_cosine"] == pytest.approx(1.0)
    assert first["centroid_energy"] == pytest.approx(1 / 3)
    assert first["centroid_turn"] is None
    # step 2, independently: torch cosines, centroid of 3 prototypes = -p_3 / 3
    keep = labels < 3
    f2 = torch.from_numpy(study["features"][2][keep].astype(np.float32)).double()
    cos = F.cosine_similarity(f2, torch.from_numpy(protos[labels[keep]]), dim=1)
    assert second["prototype_cosine"] == pytest.approx(float(cos.mean()), abs=1e-6)
    u = -protos[3] / np.linalg.norm(protos[3])
    assert second["centroid_energy"] == pytest.approx(float(((f2.numpy() @ u) ** 2).sum() / (f2.numpy() ** 2).sum()),
                                                      abs=1e-6)
    # (p0 + p1) . (-p3) = 2/3, |p0 + p1| = sqrt(4/3): cos = 1/sqrt(3)
    assert second["centroid_turn"] == pytest.approx(math.degrees(math.acos(1 / S3)))
    # step 3: all 4 prototypes assigned, their centroid is zero
    assert third["centroid_energy"] is None and third["centroid_turn"] is None and "sum to zero" in third["note"]


def test_learned_rows_and_missing_checkpoints(db_url, tmp_path):
    study = store_probe_study(db_url, tmp_path)
    rows = _stored_probe(db_url, study["experiments"]["bct"])
    assert {r["prototypes"] for r in rows} == {"learned classifier rows"}
    w, f1, labels = study["linear_rows"], study["features"][1], study["labels"]
    keep = labels < 2
    expected = F.cosine_similarity(torch.from_numpy(f1[keep]), torch.from_numpy(w[labels[keep]]), dim=1).mean()
    assert rows[0]["prototype_cosine"] == pytest.approx(float(expected), abs=1e-6)
    missing = _stored_probe(db_url, study["experiments"]["independent"])
    assert all(r["prototype_cosine"] is None and "no checkpoint" in r["note"] for r in missing)


# ------------------------------------------------------------------------------------------ the Geometry page


def test_geometry_page_shows_the_probe(app_db, tmp_path):
    from support.app_pages import open_page, texts

    study = store_probe_study(app_db, tmp_path)
    at = open_page("geometry")
    options = at.selectbox(key="geo_experiment").options  # experiment labels, "... (method) ..."

    def show(method: str) -> None:
        (index,) = [i for i, label in enumerate(options) if f"({method})" in label]
        at.selectbox(key="geo_experiment").set_value(index).run()
        assert not at.exception, at.exception

    show("cores")
    page = texts(at)
    assert "Stationarity probe" in page and "How to read it" in page
    stored = _stored_probe(app_db, study["experiments"]["cores"])
    (table,) = [d.value for d in at.dataframe if "cosine to own prototype" in d.value]
    assert list(table["cosine to own prototype"]) == pytest.approx([r["prototype_cosine"] for r in stored])
    assert table["energy along centroid"].iloc[0] == pytest.approx(1 / 3)
    assert table["centroid turn (°)"].iloc[1] == pytest.approx(math.degrees(math.acos(1 / S3)))
    # a learnable classifier: says its rows stand in for the prototypes
    show("bct")
    assert "weight rows of each step stand in for the prototypes" in texts(at)
    # no checkpoint: says why there is no probe
    show("independent")
    assert "no checkpoint" in texts(at)
