"""storage repository: experiments, model versions, feature sets (atomic upsert), matrices, analyses, cascades."""
import numpy as np
import pytest
from sqlalchemy import func, select

import storage.types
from storage import (
    Analysis,
    CompatibilityMatrix,
    Experiment,
    FeatureSet,
    Job,
    ModelVersion,
    add_model_version,
    clear_experiment,
    copy_feature_sets,
    create_experiment,
    create_study,
    delete_experiment,
    enqueue_job,
    find_experiment_by_hash,
    get_experiment,
    get_model_version,
    list_experiments,
    list_feature_views,
    list_model_versions,
    load_analysis,
    load_feature_set,
    load_matrices,
    save_analysis,
    save_feature_set,
    save_feature_sets,
    save_matrix,
    session_scope,
    set_experiment_status,
    set_experiment_study,
)

pytestmark = pytest.mark.both_databases  # tests/conftest.py: SQLite and a throw-away PostgreSQL

FEATURES = np.array([[0.0, 1.0, -0.0], [np.nan, 2.0, 3.0]], dtype=np.float32)
LABELS = np.array([4, 7])


def new_experiment(session, name="e", config_hash="h", study_id=None) -> int:
    return create_experiment(session, name=name, method="bct", config={"lr": 0.1}, config_hash=config_hash,
                             study_id=study_id).id


def new_model_version(session, experiment_id, step=1) -> int:
    return add_model_version(session, experiment_id, step, architecture="resnet18", method="bct",
                             classes=list(range(5 * step)), num_outputs=5 * step, feature_dim=3).id


@pytest.fixture
def model_version_id(engine):
    with session_scope(engine) as session:
        return new_model_version(session, new_experiment(session))


def count(engine, model) -> int:
    with session_scope(engine) as session:
        return session.scalar(select(func.count()).select_from(model))


def feature_rows(engine) -> list[tuple]:
    """Every feature set's id, contents (from the store or the row's blobs) and count."""
    with session_scope(engine) as session:
        rows = session.execute(select(FeatureSet.id, FeatureSet.model_version_id, FeatureSet.split, FeatureSet.view,
                                      FeatureSet.count))
        loaded = [(row.id, load_feature_set(session, *row[1:4]), row.count) for row in rows]
        return [(row_id, features.tobytes(), labels.tobytes(), n) for row_id, (features, labels, _), n in loaded]


# --- experiments -----------------------------------------------------------------------------


def test_find_experiment_by_hash_returns_the_newest_finished_one(engine):
    with session_scope(engine) as session:
        old, new, running = (new_experiment(session, name) for name in ("old", "new", "running"))
        new_experiment(session, "other", config_hash="other")
        for experiment_id in (old, new):
            set_experiment_status(session, experiment_id, "done")
        set_experiment_status(session, running, "running")
    with session_scope(engine) as session:
        assert find_experiment_by_hash(session, "h").id == new
        assert find_experiment_by_hash(session, "h", status=None).id == running
        assert find_experiment_by_hash(session, "missing") is None


def test_set_experiment_status_stamps_finished_at_and_rejects_unknown_statuses(engine):
    with session_scope(engine) as session:
        experiment_id = new_experiment(session)
        set_experiment_status(session, experiment_id, "failed", error="CUDA out of memory")
    with session_scope(engine) as session:
        experiment = session.get(Experiment, experiment_id)
        assert (experiment.status, experiment.error) == ("failed", "CUDA out of memory")
        assert experiment.finished_at is not None
        set_experiment_status(session, experiment_id, "running")
        assert experiment.finished_at is None and experiment.error is None
        with pytest.raises(ValueError, match="status must be one of .* got 'finished'"):
            set_experiment_status(session, experiment_id, "finished")


def test_list_experiments_loads_the_study_for_use_after_the_session(engine):
    with session_scope(engine) as session:
        study_id = create_study(session, name="bct vs cores", kind="compare").id
        new_experiment(session, "in study", study_id=study_id)
        new_experiment(session, "alone")
    with session_scope(engine) as session:
        everything = list_experiments(session)
        in_study = list_experiments(session, study_id=study_id)
    assert [e.name for e in everything] == ["alone", "in study"]
    assert everything[1].study.name == "bct vs cores" and everything[0].study is None
    assert [e.name for e in in_study] == ["in study"]


def test_experiment_in_a_missing_study_is_refused(engine):
    with pytest.raises(ValueError, match="Study 9 does not exist"):
        with session_scope(engine) as session:
            new_experiment(session, study_id=9)
    assert count(engine, Experiment) == 0


# --- model versions ----------------------------------------------------------------------------


def test_add_model_version_upserts_by_experiment_and_step(engine):
    with session_scope(engine) as session:
        experiment_id = new_experiment(session)
        first = new_model_version(session, experiment_id, step=1)
        second = new_model_version(session, experiment_id, step=2)
    with session_scope(engine) as session:
        again = add_model_version(session, experiment_id, 1, architecture="resnet50", method="bct",
                                  classes=np.arange(3), num_outputs=3, feature_dim=64, replaced=True)
    assert again.id == first
    with session_scope(engine) as session:
        versions = list_model_versions(session, experiment_id)
    assert [(v.id, v.step) for v in versions] == [(first, 1), (second, 2)]
    assert (versions[0].architecture, versions[0].classes, versions[0].feature_dim, versions[0].replaced) == (
        "resnet50", [0, 1, 2], 64, True)


@pytest.mark.parametrize("step", [0, -1, 1.5, True])
def test_model_version_steps_are_1_based_integers(engine, step):
    with pytest.raises(ValueError, match="step is 1-based"):
        with session_scope(engine) as session:
            add_model_version(session, new_experiment(session), step, architecture="resnet18", method="bct",
                              classes=[0, 1], num_outputs=2, feature_dim=3)
    assert count(engine, ModelVersion) == 0


# --- feature sets ----------------------------------------------------------------------------


def test_feature_set_round_trips_bit_exact(engine, model_version_id):
    image_ids = np.array([10, 11], dtype=np.int64)
    with session_scope(engine) as session:
        save_feature_set(session, model_version_id, "gallery", "encoder", FEATURES, LABELS, image_ids)
        save_feature_set(session, model_version_id, "gallery", "F(old)", FEATURES[:, :2], LABELS)
    with session_scope(engine) as session:
        features, labels, ids = load_feature_set(session, model_version_id, "gallery", "encoder")
        assert load_feature_set(session, model_version_id, "gallery", "F(old)")[2] is None
        assert list_feature_views(session, model_version_id, "gallery") == ["F(old)", "encoder"]
        assert list_feature_views(session, model_version_id, "query") == []
    for loaded, original in ((features, FEATURES), (labels, LABELS), (ids, image_ids)):
        assert loaded.dtype == original.dtype and loaded.tobytes() == original.tobytes()


def test_save_feature_sets_stores_every_split_and_view_and_skips_empty_outputs(engine, model_version_id):
    query = np.arange(6, dtype=np.float32).reshape(2, 3)
    outputs = {"query": {"encoder": query, "logits": query[:, :0]}, "gallery": {"logits": FEATURES}}
    with session_scope(engine) as session:
        save_feature_sets(session, model_version_id, outputs, {"query": np.array([4, 5]), "gallery": LABELS})
    with session_scope(engine) as session:
        assert list_feature_views(session, model_version_id, "query") == ["encoder"]  # the (2, 0) logits are not stored
        features, labels, _ = load_feature_set(session, model_version_id, "query", "encoder")
        assert features.tobytes() == query.tobytes() and labels.tolist() == [4, 5]
        assert load_feature_set(session, model_version_id, "gallery", "logits")[0].tobytes() == FEATURES.tobytes()


def test_saving_a_feature_set_twice_keeps_one_row_with_the_second_values(engine, model_version_id):
    second = np.full((3, 4), 9.0)
    with session_scope(engine) as session:
        first_id = save_feature_set(session, model_version_id, "query", "psp", FEATURES, LABELS)
    with session_scope(engine) as session:
        second_id = save_feature_set(session, model_version_id, "query", "psp", second, np.arange(3))
    assert second_id == first_id
    assert feature_rows(engine) == [(first_id, second.tobytes(), np.arange(3).tobytes(), 3)]
    with session_scope(engine) as session:
        row = session.get(FeatureSet, first_id)
        assert (row.dim, row.count) == (4, 3)


def test_a_crash_inside_the_replacing_write_leaves_the_previous_row_intact(engine, model_version_id, monkeypatch):
    with session_scope(engine) as session:
        save_feature_set(session, model_version_id, "query", "psp", FEATURES, LABELS)
    before = feature_rows(engine)
    real_to_npy, calls = storage.types.array_to_npy, []

    def crash_on_second_array(value):
        calls.append(value)
        if len(calls) == 2:  # features already serialised, labels not yet
            raise OSError("disk full")
        return real_to_npy(value)

    monkeypatch.setattr(storage.types, "array_to_npy", crash_on_second_array)
    with pytest.raises(Exception, match="disk full"):
        with session_scope(engine) as session:
            save_feature_set(session, model_version_id, "query", "psp", np.ones((5, 3)), np.arange(5))
    assert len(calls) == 2
    calls.clear()
    with pytest.raises(Exception, match="disk full"):  # a new key: nothing half-inserted either
        with session_scope(engine) as session:
            save_feature_set(session, model_version_id, "query", "encoder", np.ones((5, 3)), np.arange(5))
    assert feature_rows(engine) == before


def test_an_error_after_the_write_but_before_commit_rolls_everything_back(engine, model_version_id):
    with session_scope(engine) as session:
        save_feature_set(session, model_version_id, "query", "psp", FEATURES, LABELS)
    before = feature_rows(engine)
    with pytest.raises(RuntimeError, match="worker killed"):
        with session_scope(engine) as session:
            save_feature_set(session, model_version_id, "query", "psp", np.ones((5, 3)), np.arange(5))
            save_feature_set(session, model_version_id, "query", "logits", np.ones((5, 3)), np.arange(5))
            raise RuntimeError("worker killed")
    assert feature_rows(engine) == before


@pytest.mark.parametrize(
    ("split", "view", "features", "labels", "image_ids", "message"),
    [
        ("query", "psp", np.zeros(4), np.arange(4), None, r"features must be a 2-D array .* got shape \(4,\)"),
        ("query", "psp", np.zeros((4, 2), dtype=object), np.arange(4), None, "object arrays need pickle"),
        ("query", "psp", np.array([["a", "b"]]), np.arange(1), None, "features must be a float or integer array"),
        ("query", "psp", np.zeros((4, 2)), np.arange(3), None, r"one label per feature row \(4\), got shape \(3,\)"),
        ("query", "psp", np.zeros((4, 2)), np.zeros((4, 1), int), None, "labels must be 1-D"),
        ("query", "psp", np.zeros((4, 2)), np.zeros(4), None, "labels must be integer class indices, got float64"),
        ("query", "psp", np.zeros((4, 2)), np.arange(4), np.arange(5), r"one id per feature row \(4\)"),
        ("test", "psp", np.zeros((4, 2)), np.arange(4), None, "split must be one of 'query', 'gallery', 'train'"),
        ("query", "", np.zeros((4, 2)), np.arange(4), None, "view must be a non-empty name"),
    ],
    ids=["1-d features", "object features", "string features", "short labels", "2-d labels", "float labels",
         "long image ids", "unknown split", "empty view"],
)
def test_bad_feature_inputs_are_refused_with_a_clear_message_and_nothing_written(
    engine, model_version_id, split, view, features, labels, image_ids, message
):
    with pytest.raises(ValueError, match=message):
        with session_scope(engine) as session:
            save_feature_set(session, model_version_id, split, view, features, labels, image_ids)
    assert count(engine, FeatureSet) == 0


def test_features_of_a_missing_model_version_are_refused(engine):
    with pytest.raises(ValueError, match="ModelVersion 42 does not exist"):
        with session_scope(engine) as session:
            save_feature_set(session, 42, "query", "psp", FEATURES, LABELS)


def test_loading_a_missing_view_names_the_stored_ones(engine, model_version_id):
    with session_scope(engine) as session:
        save_feature_set(session, model_version_id, "gallery", "encoder", FEATURES, LABELS)
        with pytest.raises(ValueError, match=r"no 'gallery' features with view 'psp' .* stored views: \['encoder'\]"):
            load_feature_set(session, model_version_id, "gallery", "psp")


# --- matrices and analyses ---------------------------------------------------------------------


def matrix_arrays(scale: float = 1.0) -> dict:
    values = np.array([[0.5, np.nan], [0.25, 0.75]], dtype=np.float32) * scale
    return {"values": values, "valid_queries": np.array([[10, 0], [10, 10]]),
            "no_positive": np.array([[1, 0], [0, 2]], dtype=np.int32)}


def test_save_matrix_upserts_on_its_key_and_stores_float64(engine):
    with session_scope(engine) as session:
        experiment_id = new_experiment(session)
        first = save_matrix(session, experiment_id, metric="map", gallery_kind="instance", view="encoder",
                            summary={"AC": 0.5}, **matrix_arrays())
        save_matrix(session, experiment_id, metric="recall@1", gallery_kind="instance", view="encoder",
                    summary={}, **matrix_arrays())
        save_matrix(session, experiment_id, metric="map", gallery_kind="instance", view="encoder", eval_classes="old",
                    summary={}, **matrix_arrays())
    with session_scope(engine) as session:
        again = save_matrix(session, experiment_id, metric="map", gallery_kind="instance", view="encoder",
                            summary={"AC": 1.0, "ACA": np.nan}, **matrix_arrays(scale=2.0))
    assert again == first
    with session_scope(engine) as session:
        matrices = load_matrices(session, experiment_id)
        only_map = load_matrices(session, experiment_id, metric="map", view="encoder")
    assert [(m.metric, m.eval_classes) for m in matrices] == [("map", "all"), ("map", "old"), ("recall@1", "all")]
    assert len(only_map) == 2
    updated = matrices[0]
    assert updated.values.dtype == np.float64 and updated.summary == {"AC": 1.0, "ACA": None}
    np.testing.assert_array_equal(updated.values, [[1.0, np.nan], [0.5, 1.5]])
    np.testing.assert_array_equal(updated.no_positive, [[1, 0], [0, 2]])


@pytest.mark.parametrize(
    ("change", "message"),
    [({"values": np.zeros((2, 3))}, "square T x T"),
     ({"valid_queries": np.zeros((2, 2))}, "valid_queries must be an integer array shaped like values"),
     ({"no_positive": np.zeros((3, 3), int)}, "no_positive must be an integer array"),
     ({"gallery_kind": "pairs"}, "gallery_kind must be one of 'instance', 'template'")],
)
def test_bad_matrices_are_refused(engine, change, message):
    arguments = {"metric": "map", "gallery_kind": "instance", "view": "encoder", "summary": {}, **matrix_arrays(),
                 **change}
    with pytest.raises(ValueError, match=message):
        with session_scope(engine) as session:
            save_matrix(session, new_experiment(session), **arguments)
    assert count(engine, CompatibilityMatrix) == 0


def test_analysis_cache_upserts_by_key_and_misses_return_none(engine):
    with session_scope(engine) as session:
        experiment_id = new_experiment(session)
        first = save_analysis(session, experiment_id, "projection", "umap/step=2", {"n": 2}, np.zeros((2, 2)))
    with session_scope(engine) as session:
        assert save_analysis(session, experiment_id, "projection", "umap/step=2", {"n": 3}) == first
        cached = load_analysis(session, experiment_id, "projection", "umap/step=2")
        assert (cached.payload, cached.array) == ({"n": 3}, None)
        assert load_analysis(session, experiment_id, "projection", "umap/step=3") is None
    assert count(engine, Analysis) == 1


# --- cascades --------------------------------------------------------------------------------


def test_deleting_an_experiment_removes_everything_it_owns_and_keeps_its_jobs(engine):
    with session_scope(engine) as session:
        doomed, kept = new_experiment(session, "doomed"), new_experiment(session, "kept")
        for experiment_id in (doomed, kept):
            for step in (1, 2):
                version = new_model_version(session, experiment_id, step)
                save_feature_set(session, version, "query", "encoder", FEATURES, LABELS)
            save_matrix(session, experiment_id, metric="map", gallery_kind="template", view="encoder", summary={},
                        **matrix_arrays())
            save_analysis(session, experiment_id, "backfill", "curve", {})
        job_id = enqueue_job(session, "train", {}, experiment_id=doomed)
    with session_scope(engine) as session:
        assert delete_experiment(session, doomed) is True
        assert delete_experiment(session, doomed) is False
    with session_scope(engine) as session:
        for model in (ModelVersion, CompatibilityMatrix, Analysis):
            assert set(session.scalars(select(model.experiment_id))) == {kept}
        owners = select(ModelVersion.experiment_id).join(FeatureSet.model_version)
        assert session.scalars(owners).all() == [kept, kept]
        assert session.get(Job, job_id).experiment_id is None


def test_get_returns_the_row_or_none(engine, model_version_id):
    with session_scope(engine) as session:
        mv = get_model_version(session, model_version_id)
        assert (mv.step, mv.experiment.name) == (1, "e")
        assert get_experiment(session, mv.experiment_id).config == {"lr": 0.1}
        assert get_experiment(session, 999) is None and get_model_version(session, 999) is None


def test_set_experiment_study_refuses_a_missing_study(engine):
    with session_scope(engine) as session:
        exp_id, study_id = new_experiment(session), create_study(session, name="s", kind="compare").id
        set_experiment_study(session, exp_id, study_id)
        assert get_experiment(session, exp_id).study_id == study_id
        with pytest.raises(ValueError, match="Study 99 does not exist"):
            set_experiment_study(session, exp_id, 99)


def test_copy_feature_sets_copies_the_chosen_views_with_image_ids(engine, model_version_id):
    ids = np.array([10, 11])
    with session_scope(engine) as session:
        save_feature_set(session, model_version_id, "query", "encoder", FEATURES, LABELS, ids)
        save_feature_set(session, model_version_id, "gallery", "F(perp,to=2)", FEATURES, LABELS)
        target = new_model_version(session, new_experiment(session, "copy", "h2"))
        copy_feature_sets(session, model_version_id, target, ("encoder", "logits"))
        assert list_feature_views(session, target, "query") == ["encoder"]
        assert list_feature_views(session, target, "gallery") == []  # an adapted view is not one of the copied views
        features, labels, image_ids = load_feature_set(session, target, "query", "encoder")
    np.testing.assert_array_equal(features, FEATURES)
    assert labels.tolist() == [4, 7] and image_ids.tolist() == [10, 11]


def test_clear_experiment_removes_what_it_recorded_but_keeps_the_experiment(engine, model_version_id):
    values = np.eye(2)
    with session_scope(engine) as session:
        exp_id = get_model_version(session, model_version_id).experiment_id
        save_feature_set(session, model_version_id, "query", "encoder", FEATURES, LABELS)
        save_matrix(session, exp_id, metric="map", gallery_kind="instance", view="encoder", values=values,
                    valid_queries=np.ones((2, 2), int), no_positive=np.zeros((2, 2), int), summary={})
        save_analysis(session, exp_id, "k", "key", {})
        clear_experiment(session, exp_id)
    assert [count(engine, m) for m in (Experiment, ModelVersion, FeatureSet, CompatibilityMatrix, Analysis)] == [1, 0, 0, 0, 0]
