"""``python -m engine reproduce``: named paper cells, resumable runs found by config hash, queued run jobs, and the
table's numbers checked against the stored matrices recomputed by hand."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engine.data.fashion_files import fashion_available
from engine.reproduce.claims import CLAIMS, CONTROL, GROUPS, PaperCell, claim_names
from engine.reproduce.plan import enqueue_missing, experiment_hash, missing_seeds, stored_runs, study_config
from engine.reproduce.sensitivity import compute_matrix, conventions, sensitivity_rows, stored_or_computed
from engine.reproduce.table import _verdict, cell_value, claim_rows, render
from storage import find_experiment_by_hash, get_engine, init_db, list_jobs, load_matrices, session_scope

ROOT = Path(__file__).resolve().parents[1]
fashion = pytest.mark.skipif(not fashion_available(), reason="Fashion-MNIST absent: apt-get install dataset-fashion-mnist")


def test_p2_tab2_quotes_paper_002_table_2():
    """CoReS M: (1,1) .59, (2,1) .61, (3,1) .60, (2,2) .63, (3,2) .61 -> +2 / +1 / -2 points, AC 2/3 (Tab. 11: 0.67)."""
    cores = {c.label: c.value for c in CLAIMS["P2-Tab2"].cells if c.method == "cores"}
    assert cores["(phi2, phi1) margin"] == pytest.approx(0.61 - 0.59)
    assert cores["(phi3, phi1) margin"] == pytest.approx(0.60 - 0.59)
    assert cores["(phi3, phi2) margin"] == pytest.approx(0.61 - 0.63)
    assert round(cores["AC"], 2) == 0.67
    assert CLAIMS["P2-Tab2"].methods[-1] == CONTROL
    assert CLAIMS["P2-Tab2"].paper_convention["metric"] == "verification"


def test_names_and_scales_are_checked():
    assert claim_names("demo") == GROUPS["demo"]
    with pytest.raises(ValueError, match="unknown table cell"):
        claim_names("P9-Tab9")
    with pytest.raises(ValueError, match="unknown scale"):
        study_config(CLAIMS["P2-Tab2"], "huge")
    reduced = study_config(CLAIMS["P2-Tab2"], "reduced")
    assert len(reduced.seeds) >= 10 and reduced.dataset.test_per_class * 10 >= 4000  # the reduced scale


def test_verdict_words_on_hand_intervals():
    up, down, tie = PaperCell("cores", "m", 0.02, (1, 0)), PaperCell("cores", "m", -0.02, (2, 1)), PaperCell("bct", "m", 0.0, (1, 0))
    iv = lambda lo, hi: {"mean": (lo + hi) / 2, "lo": lo, "hi": hi, "n": 10}  # noqa: E731
    assert _verdict(up, iv(0.001, 0.03), None) == "reproduces"
    assert _verdict(up, iv(-0.01, 0.03), None) == "unresolved"
    assert _verdict(up, iv(-0.03, -0.01), None) == "does not"
    assert _verdict(down, iv(-0.03, -0.01), None) == "reproduces"
    assert _verdict(tie, iv(-0.01, 0.01), None) == "reproduces"
    assert _verdict(tie, iv(0.011, 0.02), None) == "does not"  # outside the +/- 1 point of a printed tie
    assert _verdict(tie, iv(0.005, 0.02), None) == "unresolved"  # overlaps the band without lying in it
    assert _verdict(tie, iv(-0.3, 0.3), None) == "unresolved"  # holding 0 is no evidence of a tie
    ac = PaperCell("cores", "AC", 2 / 3)
    assert _verdict(ac, iv(0.5, 0.9), 0.0) == "reproduces"
    assert _verdict(ac, iv(0.0, 0.9), 0.0) == "unresolved"  # the control's AC is inside too: cannot tell them apart
    assert _verdict(ac, iv(0.0, 0.3), 0.0) == "does not"
    assert _verdict(PaperCell("cores", "AC", 0.0), iv(0.0, 0.0), 0.0) == "unresolved"  # the control fails the same way
    assert _verdict(ac, {"mean": 0.5, "lo": None, "hi": None, "n": 1}, 0.0) == "unresolved"


def _args(**kw) -> argparse.Namespace:
    return argparse.Namespace(**{"name": "P2-Tab2", "scale": "smoke", "seeds": None, "here": False, "table": False,
                                 "device": "cpu", "sensitivity": False, "checkpoints": Path("data") / "checkpoints", **kw})


def test_missing_seeds_are_queued_once_as_run_jobs(tmp_path):
    from engine.cli.reproduce import reproduce

    db = get_engine(f"sqlite:///{tmp_path / 'db.sqlite'}")
    init_db(db)
    cfg = study_config(CLAIMS["P2-Tab2"], "smoke", device="cpu")
    new, queued = enqueue_missing(db, cfg)
    assert len(new) == len(cfg.seeds) and queued == []
    assert enqueue_missing(db, cfg) == ([], new)  # queued jobs are not queued again
    with session_scope(db) as s:
        jobs = [j for j in list_jobs(s) if j.kind == "run"]
        assert sorted(j.payload["config"]["seed"] for j in jobs) == list(cfg.seeds)
        assert all(j.payload["config"]["seeds"] == [] for j in jobs)
    assert reproduce(_args(), db, run_here=lambda *a: pytest.fail("not --here")) == 3  # unfinished: exit 3


@pytest.mark.slow
@fashion
def test_smoke_reproduction_resumes_and_prints_the_stored_margins(tmp_path, capsys):
    from engine.cli import main

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    argv = ["reproduce", "P2-Tab2", "--scale", "smoke", "--here", "--device", "cpu", "--db", url,
            "--checkpoints", str(tmp_path / "ckpt")]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "running seed 0 here" in first and "running seed 1 here" in first
    assert "thread(s)" in first and "device cpu" in first
    assert main(argv + ["--table"]) == 0  # everything stored: nothing runs again (found by config hash)
    second = capsys.readouterr().out
    # 8 paper cells + 4 control rows, under seen, then all, then all split by pair type (both trained / not)
    assert "running seed" not in second and second.count("| P2-Tab2 |") == (8 + 4) * 4
    made = next(line for line in second.splitlines() if line.startswith("Made with: "))
    assert "runs recorded compute_threads 1" in made and "device cpu" in made.split("runs recorded")[1]  # the runs' own
    assert "Interval: 95 %, hierarchical bootstrap over seeds" in second

    db = get_engine(url)
    cfg = study_config(CLAIMS["P2-Tab2"], "smoke", device="cpu")
    assert missing_seeds(db, cfg) == []
    runs = stored_runs(db, cfg)
    assert set(runs) == {(s, m) for s in cfg.seeds for m in cfg.methods}
    rows = claim_rows(db, CLAIMS["P2-Tab2"], runs, interval="seeds")
    by_label = {(r.method, r.label): r for r in rows if r.reading is None}
    default = {(r.method, r.label): r for r in claim_rows(db, CLAIMS["P2-Tab2"], runs) if r.reading is None}
    assert {r.interval_kind for r in default.values()} == {"hierarchical"}
    assert all(default[key].values == by_label[key].values for key in by_label)
    with session_scope(db) as s:  # the (phi3, phi1) margin of CoReS recomputed from the stored matrices by hand
        margins = []
        for seed in cfg.seeds:
            exp = find_experiment_by_hash(s, experiment_hash(cfg, seed, "cores"))
            (m,) = [m for m in load_matrices(s, exp.id, metric="verification", view="encoder") if m.eval_classes == "seen"]
            C = np.asarray(m.values)
            margins.append(C[2, 0] - C[0, 0])
    row = by_label[("cores", "(phi3, phi1) margin")]
    assert row.values == pytest.approx(margins)
    mean, half = np.mean(margins), 12.706204736 * np.std(margins, ddof=1) / np.sqrt(2)  # t(0.975, 1 df)
    assert row.interval["mean"] == pytest.approx(mean)
    assert (row.interval["lo"], row.interval["hi"]) == pytest.approx((mean - half, mean + half), abs=1e-9)
    assert cell_value(C, None) == pytest.approx(np.mean([C[1, 0] > C[0, 0], C[2, 0] > C[0, 0], C[2, 1] > C[1, 1]]))
    assert "independent (control)" in render(CLAIMS["P2-Tab2"], rows)

    # sensitivity: the run's own convention recomputed from the stored features is the pipeline's matrix, exactly
    exp_id = runs[(1, "cores")]
    again = compute_matrix(db, exp_id, view="encoder", metric="verification", gallery="instance", eval_classes="seen")
    np.testing.assert_array_equal(again.values["verification"], C)
    seen = stored_or_computed(db, exp_id, view="encoder", metric="recall@1", gallery="template", eval_classes="seen")
    with session_scope(db) as s:  # a convention the run did not compute is stored beside its own, read back next time
        (m,) = [m for m in load_matrices(s, exp_id, metric="recall@1", gallery_kind="template", view="encoder")
                if m.eval_classes == "seen"]
        np.testing.assert_array_equal(np.asarray(m.values), seen)
    sens = sensitivity_rows(db, CLAIMS["P2-Tab2"], runs, ["cores"])
    assert len(sens) == len(conventions(CLAIMS["P2-Tab2"])) == 1 * 2 + 2 * 4  # verification: no template gallery
    own = next(r for r in sens if (r["metric"], r["eval_classes"], r["gallery"]) == ("verification", "seen", "instance"))
    assert own["values"] == pytest.approx(list(by_label[("cores", "AC")].values))


def test_unknown_name_is_one_line_exit_2(tmp_path):
    out = subprocess.run([sys.executable, "-m", "engine", "reproduce", "P9", "--db", f"sqlite:///{tmp_path / 'x.db'}"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2 and out.stderr.strip().startswith("error: unknown table cell 'P9'")
    assert len(out.stderr.strip().splitlines()) == 1


@pytest.mark.slow
@fashion
def test_queued_seeds_run_by_a_worker_are_found_again(tmp_path):
    """The run jobs a worker finishes store the experiments under the hashes the reproduction looks for."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "engine", "reproduce", "P2-Tab2", "--scale", "smoke", "--seeds", "1", "--db", url]
    first = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert first.returncode == 3 and "queued run jobs" in first.stdout, first.stderr
    worker = subprocess.run([sys.executable, "-m", "engine", "worker", "--once", "--threads", "1", "--db", url,
                             "--checkpoints", str(tmp_path / "ckpt")], cwd=tmp_path, capture_output=True, text=True,
                            timeout=600, env=env)
    assert worker.returncode == 0, worker.stderr
    again = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env)
    assert again.returncode == 0 and "queued" not in again.stdout, again.stdout + again.stderr
    cfg = study_config(CLAIMS["P2-Tab2"], "smoke", 1)
    assert set(stored_runs(get_engine(url), cfg)) == {(0, m) for m in cfg.methods}
