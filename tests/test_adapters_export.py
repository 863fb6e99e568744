"""An exported post-hoc adapter (engine/adapters/artifact.py) and ``python -m engine adapter fit|curve|apply``: the
folder round-trips, the batch apply equals the in-product map in every output format, and every bad file or
argument is one line (exit 2) that leaves nothing written."""
from __future__ import annotations

import json
import pickle

import numpy as np
import pyarrow.parquet as pq
import pytest

from engine.adapters.artifact import AdapterFileError, load_adapter, save_adapter
from engine.adapters.posthoc import fit_map
from support.adapters_export import pairs, run, small_map  # noqa: F401 (fixtures among them)

ort = pytest.importorskip("onnxruntime")




# The batch apply maps 64-row blocks; the expectation maps the whole array. Both are float32 products of unit rows,
# and BLAS takes other paths for other block shapes (kernels, summation order), which differ by a few ulps (an AMD CPU:
# 208 of 6,000 elements, at most 8.9e-8); 1e-6 is about 8 ulps at 1.0.
BLOCKED_ATOL = 1e-6


def same_product(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=0, atol=BLOCKED_ATOL)




@pytest.mark.parametrize("kind", ["procrustes", "affine", "cluster", "mlp"])
def test_a_saved_adapter_loads_back_equal_and_its_onnx_file_applies_it(tmp_path, kind):
    m = small_map(kind)
    m.metrics = {"recall@1": 0.5}
    folder = save_adapter(m, tmp_path / "a")
    back = load_adapter(folder)
    assert (back.kind, back.new_dim, back.old_dim, back.normalise, back.options) == (m.kind, 6, 4, "l2", m.options)
    for name, tensor in m.tensors.items():
        np.testing.assert_array_equal(back.tensors[name], tensor)
    info = json.loads((folder / "adapter.json").read_text())
    assert info["format"] == "compatibility-lab/posthoc-adapter/1" and info["metrics"] == {"recall@1": 0.5}
    x = np.random.default_rng(2).standard_normal((20, 6)).astype(np.float32)
    session = ort.InferenceSession(str(folder / "adapter.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"new": x})[0], back.apply(x), atol=1e-5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]  # no temporary folder left


def test_the_json_states_the_weights_orientation_and_x_at_w_reproduces_apply(tmp_path):
    """A team reading adapter.safetensors without this product: ``x @ weight + bias`` is the map, ``x @ weight.T`` is
    not (a square, non-symmetric weight, no normalisation, so the transpose has the right shape and differs)."""
    from safetensors.numpy import load_file

    rng = np.random.default_rng(5)
    new = rng.standard_normal((80, 5))
    old = new @ rng.standard_normal((5, 5)) + 0.1 * rng.standard_normal((80, 5))
    folder = save_adapter(fit_map("affine", new, old, normalise="none", options={"ridge": 0.0}), tmp_path / "a",
                          onnx=False)
    files = json.loads((folder / "adapter.json").read_text())["files"]
    assert "x @ W (+ b)" in files["weights_orientation"] and "x @ W.T is wrong" in files["weights_orientation"]
    assert files["formula"] == "old = new @ weight + bias"
    t = load_file(str(folder / "adapter.safetensors"))
    w, b = t["weight"].astype(np.float64), t["bias"].astype(np.float64)
    assert w.shape == (5, 5) and np.abs(w - w.T).max() > 0.1  # not symmetric: the orientation matters
    x = rng.standard_normal((30, 5))
    applied = load_adapter(folder).apply(x)
    np.testing.assert_allclose(x @ w + b, applied, rtol=1e-4, atol=1e-4)
    assert np.abs(x @ w.T + b - applied).max() > 0.1


def test_an_existing_folder_is_replaced_only_with_force(tmp_path):
    save_adapter(small_map(), tmp_path / "a")
    with pytest.raises(AdapterFileError, match="exists; give --force"):
        save_adapter(small_map("procrustes"), tmp_path / "a")
    assert load_adapter(tmp_path / "a").kind == "affine"
    save_adapter(small_map("procrustes"), tmp_path / "a", force=True)
    assert load_adapter(tmp_path / "a").kind == "procrustes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"]


def _edit_json(folder, **changes):
    info = json.loads((folder / "adapter.json").read_text())
    info.update(changes)
    (folder / "adapter.json").write_text(json.dumps(info))


@pytest.mark.parametrize("spoil,message", [
    (lambda f: (f / "adapter.json").unlink(), "adapter.json is missing"),
    (lambda f: (f / "adapter.json").write_text("{not json"), "is not valid JSON"),
    (lambda f: (f / "adapter.json").write_text("[1, 2]"), "holds a JSON list"),
    (lambda f: (f / "adapter.json").write_text(" " * (1 << 20) + "{}"), "an adapter description is at most"),
    (lambda f: _edit_json(f, format="other/1"), "is not a Compatibility Lab post-hoc adapter"),
    (lambda f: _edit_json(f, extra=1), r"unexpected keys \['extra'\]"),
    (lambda f: _edit_json(f, kind="rotate"), "unknown adapter kind 'rotate'"),
    (lambda f: _edit_json(f, options={"ridge": "lots"}), "option ridge must be float"),
    (lambda f: _edit_json(f, options={"alpha": 1.0}), "unknown option"),
    (lambda f: _edit_json(f, new_dim=7), "do not match a affine adapter of 7 -> 4"),
    (lambda f: _edit_json(f, new_dim=True), "new_dim must be an integer"),
    (lambda f: _edit_json(f, old_dim=10 ** 9), "old_dim must be an integer"),
    (lambda f: _edit_json(f, normalise="l1"), "normalise must be one of"),
    (lambda f: _edit_json(f, metrics=[1]), "metrics must be a JSON object"),
    (lambda f: (f / "adapter.safetensors").unlink(), "adapter.safetensors is missing"),
    (lambda f: (f / "adapter.safetensors").write_bytes(pickle.dumps({"weight": np.ones((6, 4))})),
     "is not a readable safetensors file"),
    (lambda f: (f / "adapter.safetensors").write_bytes(b"\0" * (3 << 20)), "more than its declared tensors"),
])
def test_a_bad_adapter_folder_is_one_line(tmp_path, spoil, message):
    folder = save_adapter(small_map(), tmp_path / "a")
    spoil(folder)
    with pytest.raises(AdapterFileError, match=message) as info:
        load_adapter(folder)
    assert "\n" not in str(info.value)


def test_wrong_tensors_in_the_weights_file_are_refused(tmp_path):
    from safetensors.numpy import save_file

    folder = save_adapter(small_map(), tmp_path / "a")
    save_file({"weight": np.ones((6, 4), np.float32)}, str(folder / "adapter.safetensors"))
    with pytest.raises(AdapterFileError, match=r"holds tensors \['weight'\], expected \['bias', 'weight'\]"):
        load_adapter(folder)
    save_file({"weight": np.ones((6, 4), np.float64), "bias": np.ones(4, np.float32)}, str(folder / "adapter.safetensors"))
    with pytest.raises(AdapterFileError, match="tensor weight is F64"):
        load_adapter(folder)
    save_file({"weight": np.full((6, 4), np.nan, np.float32), "bias": np.ones(4, np.float32)},
              str(folder / "adapter.safetensors"))
    with pytest.raises(AdapterFileError, match="NaN or infinite"):
        load_adapter(folder)




def test_fit_then_apply_round_trips_in_every_output_format(pairs, capsys):  # noqa: F811
    root, new_ids, new = pairs
    code, out, err = run(["adapter", "fit", "--old", str(root / "old.npz"), "--new", str(root / "new.npz"),
                          "--kind", "procrustes", "--pairs", "300", "--held-out", "100", "--resamples", "50",
                          "--out", str(root / "ad")], capsys)
    assert code == 0, err
    assert "fitted on 300 pairs" in out and "adapted/old" in out
    m = load_adapter(root / "ad")
    assert m.fitted_on["pairs"] == 300 and m.fitted_on["held_out"] == 100 and m.fitted_on["gallery"] == 500
    assert m.metrics["n_queries"] == 100 and m.metrics["metric"] == "recall@1"
    assert m.metrics["share of new/new"] == pytest.approx(m.metrics["adapted/old"] / m.metrics["new/new"])
    want = m.apply(new)
    for name in ("out.npy", "out.npz", "out.parquet"):
        code, out, err = run(["adapter", "apply", "--adapter", str(root / "ad"), "--in", str(root / "new.npz"),
                              "--out", str(root / name), "--block-rows", "64"], capsys)
        assert code == 0, err
        assert out.startswith("600 vectors mapped 14 -> 10 dims")
        if name.endswith(".npy"):
            same_product(np.load(root / name), want)
        elif name.endswith(".npz"):
            with np.load(root / name) as z:
                same_product(z["vectors"], want)
                np.testing.assert_array_equal(z["ids"], new_ids)
                assert len(z["labels"]) == 600
        else:
            table = pq.read_table(root / name)
            same_product(np.stack(table.column("vector").to_numpy(zero_copy_only=False)), want)
            np.testing.assert_array_equal(table.column("id").to_numpy(), new_ids)
    # the written .npz is itself a source: it applies again (an old-space file read as 10-d input is refused)
    code, _, err = run(["adapter", "apply", "--adapter", str(root / "ad"), "--in", str(root / "out.npz"),
                        "--out", str(root / "again.npy")], capsys)
    assert code == 2 and "10-d vectors, not the 14-d expected" in err and err.count("\n") == 1


def test_apply_refuses_an_existing_output_without_force_and_paths_outside_the_roots(pairs, capsys, tmp_path_factory):  # noqa: F811
    root, _, new = pairs
    save_adapter(fit_map("affine", new, new[:, :10]), root / "ad")
    (root / "y.npy").write_bytes(b"keep")
    base = ["adapter", "apply", "--adapter", str(root / "ad"), "--in", str(root / "new.npz")]
    code, _, err = run(base + ["--out", str(root / "y.npy")], capsys)
    assert code == 2 and "exists; give --force" in err and (root / "y.npy").read_bytes() == b"keep"
    code, _, err = run(base + ["--out", str(root / "y.npy"), "--force"], capsys)
    assert code == 0 and np.load(root / "y.npy").shape == (600, 10)
    outside = tmp_path_factory.mktemp("elsewhere")
    code, _, err = run(base + ["--out", str(outside / "y.npy")], capsys)
    assert code == 2 and "outside the data roots" in err and not list(outside.iterdir())
    code, _, err = run(base + ["--out", str(root / "y.csv")], capsys)
    assert code == 2 and "not .csv" in err
    code, _, err = run(["adapter", "apply", "--adapter", str(root / "nothing"), "--in", str(root / "new.npz"),
                        "--out", str(root / "z.npy")], capsys)
    assert code == 2 and "is not an adapter folder" in err and not (root / "z.npy").exists()
    assert sorted(p.name for p in root.iterdir() if p.name.startswith(".")) == []  # no temporary file left


def test_fit_refuses_bad_options_and_an_existing_folder(pairs, capsys):  # noqa: F811
    root, _, _ = pairs
    base = ["adapter", "fit", "--old", str(root / "old.npz"), "--new", str(root / "new.npz"), "--pairs", "100"]
    code, _, err = run(base + ["--kind", "affine", "--set", "lam=1", "--out", str(root / "a")], capsys)
    assert code == 2 and "unknown option(s) lam for adapter kind 'affine'" in err and not (root / "a").exists()
    code, _, err = run(base + ["--kind", "shear", "--out", str(root / "a")], capsys)
    assert code == 2 and "unknown adapter kind 'shear'" in err
    (root / "a").mkdir()
    code, _, err = run(base + ["--kind", "affine", "--out", str(root / "a")], capsys)
    assert code == 2 and "exists; give --force" in err
    code, _, err = run(base + ["--kind", "affine", "--out", str(root / "b"), "--query-old", str(root / "old.npz")],
                       capsys)
    assert code == 2 and "--query-old and --query-new together" in err


def test_curve_prints_and_writes_every_kind_at_every_count(pairs, capsys):  # noqa: F811
    root, _, _ = pairs
    code, out, err = run(["adapter", "curve", "--old", str(root / "old.npz"), "--new", str(root / "new.npz"),
                          "--kind", "procrustes", "--kind", "cluster", "--set", "cluster.clusters=2",
                          "--pairs", "100,400,9000", "--resamples", "50", "--json", str(root / "c.json")], capsys)
    assert code == 0, err
    curve = json.loads((root / "c.json").read_text())
    assert curve["pair_counts"] == [100, 400, 480] and len(curve["rows"]) == 6  # 600 items, 120 held out
    assert curve["rows"][3]["options"]["clusters"] == 2
    assert "old/old" in out and out.count(" pairs ") == 6
    code, _, err = run(["adapter", "curve", "--old", str(root / "old.npz"), "--new", str(root / "new.npz"),
                        "--kind", "procrustes", "--kind", "affine", "--set", "ridge=2"], capsys)
    assert code == 2 and "several kinds are fitted; name one" in err


def test_curve_with_separate_queries_and_no_labels(pairs, capsys):  # noqa: F811
    root, _, _ = pairs
    rng = np.random.default_rng(5)
    with np.load(root / "old.npz") as o, np.load(root / "new.npz") as n:
        order = np.argsort(n["ids"])
        old, new, ids = o["vectors"], n["vectors"][order], o["ids"]
        assert np.array_equal(n["ids"][order], ids)
    q = rng.choice(600, 80, replace=False)
    g = np.setdiff1d(np.arange(600), q)
    np.save(root / "q_old.npy", old[q])
    np.save(root / "q_new.npy", new[q])
    np.savez(root / "g_old.npz", ids=ids[g], vectors=old[g])
    np.savez(root / "g_new.npz", ids=ids[g], vectors=new[g])
    code, out, err = run(["adapter", "curve", "--old", str(root / "g_old.npz"), "--new", str(root / "g_new.npz"),
                          "--query-old", str(root / "q_old.npy"), "--query-new", str(root / "q_new.npy"),
                          "--kind", "affine", "--pairs", "100,520", "--k", "5", "--resamples", "50",
                          "--json", str(root / "c.json")], capsys)
    assert code == 0, err
    curve = json.loads((root / "c.json").read_text())
    assert curve["relevance"] == "none" and curve["metric"] == "neighbour_recall@5"
    assert curve["baselines"]["n_queries"] == 80 and curve["baselines"]["n_gallery"] == 520
    assert curve["baselines"]["new/new"] == 1.0 and curve["pair_counts"] == [100, 520]
    assert curve["fitted_on"]["queries"] == "separate"


@pytest.mark.parametrize("suffix", [".npy", ".npz"])
@pytest.mark.parametrize("said", [3, 5])
def test_a_source_that_changes_while_it_is_read_leaves_no_output(tmp_path, suffix, said):
    """A source that announced ``said`` items but yields 4: one line, and no output file (nor temporary) is left."""
    from engine.adapters.batch_apply import apply_to_file
    from engine.sources import Block

    rng = np.random.default_rng(0)
    m = fit_map("procrustes", rng.standard_normal((40, 4)), rng.standard_normal((40, 4)))

    class Shifting:
        description, dim, count = "a shifting table", 4, said

        def blocks(self, rows):
            yield Block(np.arange(4), rng.standard_normal((4, 4)).astype(np.float32), None)

    with pytest.raises(ValueError, match="a shifting table changed while it was read"):
        apply_to_file(m, Shifting(), tmp_path / f"out{suffix}")
    assert list(tmp_path.iterdir()) == []
