"""compare-checkpoints end to end: real small checkpoints -> a generated ImageFolder -> stored matrices."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from sqlalchemy import func, select
from support.checkpoints_factory import (
    FlatInput,
    TinyLogits,
    TinyPair,
    save_resnet18_safetensors,
    save_state_dict_pt,
    save_step_checkpoint,
    save_torchscript,
    small_net,
    write_image_folder,
)

from engine.checkpoints.compare import compare_checkpoints
from engine.checkpoints.store import run_checkpoint_comparison
from engine.cli import main
from engine.jobs.job_handlers import JobContext, checkpoints_job
from storage import (
    CompatibilityMatrix,
    Experiment,
    FeatureSet,
    ModelVersion,
    Study,
    create_experiment,
    list_model_versions,
    get_engine,
    init_db,
    load_matrices,
    session_scope,
)

TABLES = (Study, Experiment, ModelVersion, FeatureSet, CompatibilityMatrix)


def _counts(url):
    with session_scope(get_engine(url)) as s:
        return {t.__name__: s.scalar(select(func.count()).select_from(t)) for t in TABLES}


@pytest.fixture
def images(tmp_path):
    return write_image_folder(tmp_path / "imgs", classes=4, per_class=5)


def test_whole_path_four_formats_stored_as_one_experiment(tmp_path, images, db_url, capsys):
    save_torchscript(tmp_path / "scripted.pt", TinyPair(num_classes=4, dim=6))
    save_state_dict_pt(tmp_path / "old.pt", num_classes=4, width=16)
    save_step_checkpoint(tmp_path / "step.safetensors", num_classes=4, width=16, seed=1)
    save_resnet18_safetensors(tmp_path / "new.safetensors", num_classes=3)
    out = tmp_path / "out.json"
    code = main(["compare-checkpoints", "--model", str(tmp_path / "scripted.pt"), "--model", f"{tmp_path / 'old.pt'}:small_cnn:4",
                 "--model", str(tmp_path / "step.safetensors"), "--model", f"{tmp_path / 'new.safetensors'}:resnet18",
                 "--dataset", f"imagefolder:{images}", "--input-size", "16", "--json", str(out), "--db", db_url])
    assert code == 0
    printed = capsys.readouterr().out
    assert "encoder / recall@1 (closed-set, instance)" in printed and "n/c" in printed
    assert "note: encoder features of different sizes are not comparable" in printed
    assert "new knows 3 of the 4 classes of step" in printed  # resnet18 with 3 classes vs 4-class models
    assert "; on its own step is " in printed  # check-upgrade's second interval, beside each cross-test's
    assert "as the cross-tests' 95% intervals leave it" in printed or "interval decides it" in printed  # AC's range

    with session_scope(get_engine(db_url)) as s:
        study = s.scalars(select(Study)).one()
        exp = s.scalars(select(Experiment)).one()
        assert (study.kind, exp.method, exp.status, exp.study_id) == ("checkpoints", "checkpoints", "done", study.id)
        versions = sorted(exp.model_versions, key=lambda v: v.step)
        assert [(v.architecture, v.num_outputs, v.feature_dim) for v in versions] == [
            ("torchscript", 4, 6), ("small_cnn", 4, 16), ("small_cnn", 4, 16), ("resnet18", 3, 512)]
        assert versions[3].class_names == ["0", "1", "2"] and versions[1].checkpoint_path == str(tmp_path / "old.pt")
        views = {(fs.split, fs.view, fs.count) for v in versions for fs in v.feature_sets}
        assert views == {(split, view, 20) for split in ("query", "gallery") for view in ("encoder", "logits", "softmax")}
        assert s.scalar(select(func.count()).select_from(FeatureSet)) == 4 * 2 * 3
        matrices = {(m.view, m.metric): m for m in load_matrices(s, exp.id)}
        assert set(matrices) == {(v, m) for v in ("encoder", "psp", "lsp") for m in ("recall@1", "map")}
        enc = matrices[("encoder", "recall@1")]
        comparable = np.array(enc.summary["comparable"])
        lower = np.tril(np.ones((4, 4), bool))
        # only old (16-d) and step (16-d) share an encoder size: that one cross-test is computed
        assert comparable[lower].sum() == 4 + 1 and comparable[2, 1]
        assert np.isnan(enc.values[1, 0]) and np.isnan(enc.values[3, 2]) and not np.isnan(enc.values[2, 1])
        psp = matrices[("psp", "recall@1")].values
        assert np.all(np.isfinite(psp[lower])) and np.all((psp[lower] >= 0) & (psp[lower] <= 1))
        assert exp.config["shared_classes"][3] == [3, 3, 3, 3] and exp.config["protocol"] == "closed-set"

    data = json.loads(out.read_text())
    assert data["experiment_id"] == exp.id
    assert data["views"]["encoder"]["metrics"]["recall@1"]["matrix"][1][0] is None
    assert data["views"]["encoder"]["comparable"][1][0] is False
    assert data["views"]["psp"]["comparable"][3] == [True, True, True, True]


def _pair(tmp_path, perm, *, extra_classes=0):
    """old.pt: a 4-class small CNN; new.pt: the same network with its classifier rows permuted by ``perm``."""
    net = small_net(4, width=8, seed=3)
    torch.save(net.state_dict(), tmp_path / "old.pt")
    state = dict(net.state_dict())
    weight = state["head.fc.weight"][perm]
    if extra_classes:
        weight = torch.cat([weight, torch.randn(extra_classes, weight.shape[1], generator=torch.Generator().manual_seed(1))])
    state["head.fc.weight"] = weight
    torch.save(state, tmp_path / "new.pt")
    return {"path": str(tmp_path / "old.pt"), "arch": "small_cnn"}, {"path": str(tmp_path / "new.pt"), "arch": "small_cnn"}


def test_class_lists_align_psp_outputs_before_the_first_ck_cut(tmp_path, images):
    perm = [2, 0, 3, 1]
    old, new = _pair(tmp_path, perm)
    names = ["cat", "dog", "fox", "owl"]
    old["classes"], new["classes"] = names, [names[i] for i in perm]
    spec = {"models": [old, new], "dataset": f"imagefolder:{images}", "views": ["psp", "lsp"]}
    aligned = compare_checkpoints(spec)
    for view in ("psp", "lsp"):
        for metric, C in aligned.results[view].values.items():
            # new = old with renamed outputs: once aligned its queries are old's queries, exactly
            assert C[1, 0] == C[0, 0] == C[1, 1], (view, metric)
    old.pop("classes"), new.pop("classes")
    unaligned = compare_checkpoints(spec)  # output i taken as class i: the permutation scrambles the cross-test
    assert unaligned.results["psp"].values["map"][1, 0] != unaligned.results["psp"].values["map"][0, 0]


def test_a_superset_model_keeps_the_gallery_models_classes_first(tmp_path, images):
    old, new = _pair(tmp_path, [0, 1, 2, 3], extra_classes=2)  # new = old's 4 classes + 2 more
    cmp = compare_checkpoints({"models": [old, new], "dataset": f"imagefolder:{images}", "views": ["psp"]})
    assert cmp.shared[1].tolist() == [4, 6]
    # the cut to old's 4 outputs leaves new's softmax over 6 classes: close to old's features, not equal
    assert not cmp.notes and np.isfinite(cmp.results["psp"].values["recall@1"][1, 0])


def test_models_sharing_no_classes_are_refused_unless_psp_and_lsp_are_left_out(tmp_path, images):
    old, new = _pair(tmp_path, [0, 1, 2, 3])
    old["classes"], new["classes"] = "a,b,c,d", "w,x,y,z"
    spec = {"models": [old, new], "dataset": f"imagefolder:{images}"}
    with pytest.raises(ValueError, match=r"models 1 \(old\) and 2 \(new\) share 0 class\(es\): PSP/LSP compare"):
        compare_checkpoints(spec)
    assert set(compare_checkpoints({**spec, "views": ["encoder"]}).results) == {"encoder"}


def test_logits_only_torchscript_has_no_encoder_view(tmp_path, images, db_url):
    save_torchscript(tmp_path / "a.pt", TinyLogits(num_classes=4), trace=True)
    save_torchscript(tmp_path / "b.pt", TinyPair(num_classes=4, seed=1))
    spec = {"models": [{"path": str(tmp_path / "a.pt")}, {"path": str(tmp_path / "b.pt")}], "dataset": f"imagefolder:{images}",
            "views": ["encoder", "psp"], "metrics": ["recall@1"]}
    exp_id = run_checkpoint_comparison(get_engine(db_url), spec)
    with session_scope(get_engine(db_url)) as s:
        enc = load_matrices(s, exp_id, view="encoder")[0]
        assert np.isnan(enc.values[0, 0]) and np.isnan(enc.values[1, 0]) and not np.isnan(enc.values[1, 1])
        assert s.scalar(select(func.count()).select_from(FeatureSet).where(FeatureSet.view == "encoder")) == 2  # b only
        assert "has no encoder output" in s.get(Experiment, exp_id).config["notes"][0]


def test_open_set_labels_match_by_class_name_and_count_queries_without_positive(tmp_path):
    query = write_image_folder(tmp_path / "q", classes=3, per_class=3, seed=1)
    gallery = write_image_folder(tmp_path / "g", classes=2, per_class=4, seed=2)
    save_state_dict_pt(tmp_path / "m.pt", num_classes=4, width=8)
    cmp = compare_checkpoints({"models": [{"path": str(tmp_path / "m.pt"), "arch": "small_cnn"}],
                               "query_dataset": f"imagefolder:{query}", "gallery_dataset": f"imagefolder:{gallery}",
                               "views": ["encoder"]})
    assert not cmp.same_set and cmp.dataset_classes == ("class_0", "class_1", "class_2")
    result = cmp.results["encoder"]
    assert (result.no_positive[0, 0], result.valid_queries[0, 0]) == (3, 6)  # class_2's queries have no positive


def test_json_spec_for_the_dashboard_worker(tmp_path, images, db_url):
    save_state_dict_pt(tmp_path / "a.pt", num_classes=4, width=8)
    save_step_checkpoint(tmp_path / "b.safetensors", num_classes=4, width=8, seed=2)
    spec = {"name": "upgrade", "models": [{"path": str(tmp_path / "a.pt"), "arch": "small_cnn", "num_classes": 4,
                                           "classes": ["a", "b", "c", "d"], "preprocessing": {"input_size": 16}},
                                          {"path": str(tmp_path / "b.safetensors"), "classes": "a,b,c,d"}],
            "dataset": {"name": "imagefolder", "root": str(images)}, "views": ["psp"], "max_file_bytes": "10MB"}
    spec = json.loads(json.dumps(spec))
    message = checkpoints_job(get_engine(db_url), {"spec": spec}, JobContext(lambda f, m: None, lambda: False, tmp_path))
    with session_scope(get_engine(db_url)) as s:
        exp = s.scalars(select(Experiment)).one()
        assert message == f"experiment {exp.id}" and exp.name == "upgrade"
        assert exp.config["spec"]["models"][0]["preprocessing"]["input_size"] == 16
        assert [mv.name for mv in list_model_versions(s, exp.id)] == [None, None]  # no labels, no names
    labelled = {**spec, "name": "named", "models": [{**spec["models"][0], "label": "v1"}, {**spec["models"][1], "label": "v2"}]}
    named_id = run_checkpoint_comparison(get_engine(db_url), labelled)
    with session_scope(get_engine(db_url)) as s:  # the labels are the stored models' names
        assert [mv.name for mv in list_model_versions(s, named_id)] == ["v1", "v2"]
    for labels, problem in ((("v1", "v1"), "two models share the label 'v1'"),
                            (("v1", "x" * 41), "must be 1..40 printable characters")):
        bad = {**spec, "models": [{**m, "label": label} for m, label in zip(spec["models"], labels)]}
        with pytest.raises(ValueError, match=problem):
            run_checkpoint_comparison(get_engine(db_url), bad)
    with pytest.raises(ValueError, match=r"model 1: unknown key\(s\) weights; known keys: path, arch"):
        run_checkpoint_comparison(get_engine(db_url), {**spec, "models": [{"path": "x.pt", "weights": "y"}]})
    with pytest.raises(ValueError, match=r"comparison spec: unknown key\(s\) modles"):
        run_checkpoint_comparison(get_engine(db_url), {"modles": []})


def _bad_inputs(tmp_path, images):
    save_state_dict_pt(tmp_path / "good.pt", num_classes=4, width=8)
    state = dict(small_net(4, width=8).state_dict())
    torch.save({k: v for k, v in state.items() if k != "head.fc.weight"}, tmp_path / "missing.pt")
    torch.save({**state, "head.fc.weight": torch.zeros(4, 9)}, tmp_path / "shape.pt")
    torch.save({**state, "head.fc.weight": torch.full((4, 8), float("nan"))}, tmp_path / "nan.pt")
    (tmp_path / "empty.pt").write_bytes(b"")
    (tmp_path / "trunc.pt").write_bytes((tmp_path / "good.pt").read_bytes()[:500])
    save_torchscript(tmp_path / "ts.pt", TinyPair(num_classes=4))
    save_torchscript(tmp_path / "flat.pt", FlatInput())
    good = f"{tmp_path / 'good.pt'}:small_cnn"
    folder = f"imagefolder:{images}"
    return {
        "missing keys": ([f"{tmp_path / 'missing.pt'}:small_cnn", good], [],
                         "missing.pt: does not match a small_cnn: 1 missing key(s): head.fc.weight"),
        "shape": ([good, f"{tmp_path / 'shape.pt'}:small_cnn"], [], "shape.pt: shape mismatch in layer head.fc.weight"),
        "classifier": ([good, f"{tmp_path / 'good.pt'}:small_cnn:100"], [],
                       "good.pt: its classifier head.fc.weight has 4 outputs but 100"),
        "nan": ([good, f"{tmp_path / 'nan.pt'}:small_cnn"], [], "nan.pt: has NaN/inf weights"),
        "empty": ([good, f"{tmp_path / 'empty.pt'}:small_cnn"], [], "empty.pt: is empty"),
        "truncated": ([good, f"{tmp_path / 'trunc.pt'}:small_cnn"], [], "trunc.pt: is a truncated or corrupt zip"),
        "size": ([good, good], ["--max-size", "1KB"], "good.pt: is 12.5 KB, over the 1.0 KB size limit"),
        "arch": ([f"{tmp_path / 'good.pt'}:resnet7"], [], "good.pt: unknown architecture 'resnet7'; known architectures:"),
        "torchscript classes": ([str(tmp_path / "ts.pt") + "::10"], [], "ts.pt: its forward gives 4 outputs but 10 classes"),
        "class list": ([good, good], ["--classes", "a,b,c", "--classes", "-"],
                       "good.pt: its class list has 3 names but the model has 4 outputs"),
        "classes count": ([good, good], ["--classes", "a,b,c,d"], "--classes was given 1 time(s) for 2 --model(s)"),
        "no shared classes": ([good, good], ["--classes", "a,b,c,d", "--classes", "e,f,g,h"], "share 0 class(es)"),
        "dataset": ([good], ["--dataset", f"imagefolder:{tmp_path / 'nowhere'}"], "image folder"),
        "input size": ([str(tmp_path / "flat.pt")], ["--input-size", "24"],
                       "flat.pt: fails on (3, 24, 24) input images: mat1 and mat2 shapes cannot be multiplied"),
        "channels": ([good], ["--mean", "0.5", "--std", "0.5"], "good.pt: mean/std have 1 values but the images have 3 channels"),
        "_folder": folder,
    }


def test_malformed_inputs_exit_2_with_one_line_and_leave_the_database_unchanged(tmp_path, images, db_url, capsys):
    init_db(get_engine(db_url))
    with session_scope(get_engine(db_url)) as s:
        create_experiment(s, name="earlier", method="independent", config={}, config_hash="h")
    before = _counts(db_url)
    cases = _bad_inputs(tmp_path, images)
    folder = cases.pop("_folder")
    for name, (models, extra, message) in cases.items():
        argv = ["compare-checkpoints", *[a for m in models for a in ("--model", m)], "--db", db_url, *extra]
        if "--dataset" not in extra:
            argv += ["--dataset", folder]
        assert main(argv) == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], (name, err)
        assert _counts(db_url) == before, name


def test_refused_file_in_a_fresh_process_exit_2_nothing_runs_nothing_stored(tmp_path, images):
    marker = tmp_path / "marker"
    code = f"open({str(marker)!r}, 'w').write('ran')"
    torch.save({"w": torch.zeros(1), "x": _Exec(code)}, tmp_path / "evil.pt")
    db = tmp_path / "db.sqlite"
    proc = subprocess.run([sys.executable, "-m", "engine", "compare-checkpoints", "--model", f"{tmp_path / 'evil.pt'}:small_cnn",
                           "--dataset", f"imagefolder:{images}", "--db", f"sqlite:///{db}"], capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "evil.pt: refused: unpickling it would call exec" in lines[0], proc.stderr
    assert not marker.exists() and not db.exists()


class _Exec:
    def __init__(self, code):
        self.code = code

    def __reduce__(self):
        return exec, (self.code,)
