"""``check-upgrade --plan OUT``: both files with migration_plan's decision, adapters judged as the report is judged,
the threshold re-mapped, and every bad target refused in one line before any work (numpy by hand for the numbers)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest
from sklearn.metrics import average_precision_score
from support.upgrade import DIM, compatible_pair, hits, incompatible_pair
from support.upgrade_cli import write_folder

from engine.adapters.artifact import save_adapter
from engine.adapters.posthoc import fit_map
from engine.cli import main
from engine.metrics.compatibility import CellFeatures
from engine.upgrade.plan import DEFAULT_ADAPTERS, REMEDY_DECISION, cheapest_passing, migration_plan
from support.upgrade_plan_cli import rotated_back_pair, same_decision






def run(tmp_path, pair, *extra: str) -> tuple[int, dict, dict, str]:
    folder = write_folder(tmp_path / "f", *pair())
    metric = () if "--metric" in extra else ("--metric", "recall@1")  # the pairs are built around Recall@1's hits
    code = main(["check-upgrade", "--features", str(folder), "--name", "v1", "--name", "v2", "--resamples", "300",
                 "--json", str(tmp_path / "report.json"), "--plan", str(tmp_path / "plan"), *metric, *extra])
    report = json.loads((tmp_path / "report.json").read_text())
    return code, report, json.loads((tmp_path / "plan.json").read_text()), (tmp_path / "plan.md").read_text()


def top10_pairs(q: np.ndarray, ql: np.ndarray, g: np.ndarray, gl: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each query's ten most cosine-similar gallery items by hand: scores and same-label flags."""
    s = (q / np.linalg.norm(q, axis=1, keepdims=True)) @ (g / np.linalg.norm(g, axis=1, keepdims=True)).T
    top = np.argsort(-s, axis=1, kind="stable")[:, :10]
    return np.take_along_axis(s, top, axis=1).ravel(), (gl[top] == ql[:, None]).ravel()


def lowest_with_precision(s: np.ndarray, r: np.ndarray, p: float) -> float:
    """The lowest score t with precision(score >= t) >= p, trying every distinct score."""
    return min(t for t in np.unique(s) if r[s >= t].mean() >= p - 1e-12)


@pytest.mark.parametrize("pair, code, decision", [(compatible_pair, 0, "ship as is"), (incompatible_pair, 1, "do not ship"),
                                                  (rotated_back_pair, 1, "ship with adapter")])
def test_the_plan_files_carry_migration_plans_decision_for_the_same_report(tmp_path, capsys, pair, code, decision):
    got, report, plan, md = run(tmp_path, pair)
    assert got == code  # --plan leaves check-upgrade's exit codes as they are
    again = migration_plan(report, adapters=plan["adapters"], rollouts=plan["rollouts"], threshold=plan["threshold"],
                           forecast=plan["forecast"], transforms=plan["transforms"], cascade=plan["cascade"])
    assert plan["decision"] == again.decision == decision
    assert [x for x in plan["markdown"].splitlines() if not x.startswith("- note:")] == [
        x for x in again.to_markdown().splitlines() if not x.startswith("- note:")]  # then the inputs' notes
    same_decision(md, plan)
    assert plan["report"] == report  # the report the plan was decided from, as --json wrote it
    assert set(plan) == {"decision", "reason", "old_name", "new_name", "metric", "n_gallery", "adapter", "ordering",
                         "fraction", "items_to_reembed", "numbers", "threshold", "notes", "headline", "markdown",
                         "rule", "success", "guardrail", "backfill_metric", "margin_to_decide", "recovery",
                         "forecast", "adapters", "rollouts", "rescoring", "report", "options", "remedy",
                         "vectors_to_transform", "queries", "transforms", "cascade"}
    assert f"  plan: {again.headline()} (written to plan.json and plan.md)" in capsys.readouterr().out.splitlines()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "plan.json", "plan.md", "report.json"]


def test_an_exact_rotation_back_ships_with_procrustes(tmp_path):
    old, new = rotated_back_pair()
    _, report, plan, md = run(tmp_path, rotated_back_pair)
    assert (report["verdict"], report["better"]["verdict"]) == ("not compatible", "better")
    assert (plan["decision"], plan["adapter"], plan["items_to_reembed"]) == ("ship with adapter", "procrustes", 0)
    assert "**Decision: ship with adapter procrustes.**" in md
    procrustes, affine = plan["adapters"]
    assert (procrustes["name"], affine["name"]) == ("procrustes", "affine")
    assert procrustes["pairs"] == affine["pairs"] == 100  # half of the 200 gallery items, said in the notes
    assert any("fitted on 100 paired gallery items" in n for n in plan["notes"])
    # the map is R^T: the adapted queries are the better queries, scored on the old gallery by hand
    better_on_old = hits(compatible_pair()[1], old)
    assert procrustes["adapted_old"] == pytest.approx(better_on_old.mean())
    assert procrustes["old_old"] == pytest.approx(hits(old, old).mean()) == pytest.approx(report["old_old"])
    assert procrustes["compatibility"]["diff"] == pytest.approx((better_on_old - hits(old, old)).mean())
    assert procrustes["compatibility"]["verdict"] == "compatible" and procrustes["compatibility"]["lo"] > 0
    assert procrustes["compatibility"]["lo"] >= affine["compatibility"]["lo"]


def test_the_threshold_keeps_the_old_precision_on_each_models_candidates(tmp_path):
    old, new = rotated_back_pair()
    *_, plan, _ = run(tmp_path, rotated_back_pair)
    so, ro = top10_pairs(old.query, old.query_labels, old.gallery, old.gallery_labels)
    sn, rn = top10_pairs(new.query, new.query_labels, new.gallery, new.gallery_labels)
    t_old = lowest_with_precision(so, ro, 0.9)  # the default old threshold: precision 0.9
    p = ro[so >= t_old].mean()
    t = plan["threshold"]
    assert t["t_old"] == pytest.approx(t_old, abs=1e-5) and t["precision"] == pytest.approx(p)
    assert t["t_new"] == pytest.approx(lowest_with_precision(sn, rn, p), abs=1e-5)
    assert t["n_old"] == t["n_new"] == 200 * 10
    assert any("precision 0.9 (the default)" in n for n in plan["notes"])


def test_a_given_threshold_and_an_exported_adapter(tmp_path):
    old, new = rotated_back_pair()
    m = fit_map("procrustes", new.gallery, old.gallery)
    save_adapter(m, tmp_path / "back", onnx=False)
    _, report, plan, md = run(tmp_path, rotated_back_pair, "--adapters", "--adapter", str(tmp_path / "back"),
                              "--threshold", "0.5")
    (row,) = plan["adapters"]
    assert row["name"] == "procrustes (back)" and row["source"] == str(tmp_path / "back")
    assert plan["decision"] == "ship with adapter" and plan["adapter"] == "procrustes (back)"
    so, ro = top10_pairs(old.query, old.query_labels, old.gallery, old.gallery_labels)
    assert plan["threshold"]["t_old"] == 0.5 and plan["threshold"]["precision"] == pytest.approx(ro[so >= 0.5].mean())


def test_backfill_plans_cost_their_items_and_rank_merge_is_read_above_the_old_self_test(tmp_path):
    def worse_queries():  # new queries better but the gallery moved: no adapter rotation brings them back exactly
        old, new = incompatible_pair()
        _, better = compatible_pair()
        rotation = np.linalg.qr(np.random.default_rng(3).normal(size=(DIM, DIM)))[0]
        return old, CellFeatures(better.query @ rotation, better.query_labels, better.gallery @ rotation, better.gallery_labels)

    _, report, plan, _ = run(tmp_path, worse_queries, "--adapters", "--rollout")
    # Recall@1 flatters backfilling: the plan reads its roll-outs on the mAP curves, against mAP's old self-test
    old, new = worse_queries()
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731 - cosine similarity, as the check
    ap = [average_precision_score(old.gallery_labels == y, unit(old.gallery) @ q)
          for q, y in zip(unit(old.query), old.query_labels)]
    assert report["metric"] == "recall@1" and {r["metric"] for r in plan["rollouts"]} == {"map"}
    assert all(r["old_self"] == pytest.approx(np.mean(ap), abs=1e-9) for r in plan["rollouts"])
    merges = [r for r in plan["rollouts"] if r["ordering"].startswith("rank_merge:")]
    assert merges and all(r["reaches_at"] == 0.0 for r in merges)  # at 0 % the merge is the old system itself
    for r in merges:
        above = [f for f, v in zip(r["fractions"], r["values"]) if v > r["old_self"]]
        assert r["to_old_self"] == (above[0] if above else None)
    assert all(not r["ordering"] == "rescoring" for r in plan["rollouts"]) and plan["rescoring"]["ordering"] == "rescoring"
    # the roll-outs alone decide a backfill costing its items; with the remedies side by side the plan takes the
    # cheapest passing one over its horizon (by default as many queries as gallery items)
    alone = migration_plan(report, adapters=plan["adapters"], rollouts=plan["rollouts"])
    assert alone.decision == "backfill"
    assert alone.items_to_reembed == math.ceil(alone.fraction * report["n_gallery"] - 1e-9) > 0
    (backfill,) = [o for o in plan["options"] if o["remedy"] == "backfill"]
    assert backfill["one_time"]["embeddings"] == alone.items_to_reembed and backfill["passes"]
    picked = cheapest_passing(plan["options"], plan["queries"])
    assert (plan["decision"], plan["remedy"]) == (REMEDY_DECISION[picked["remedy"]], picked["name"])


def test_same_set_adapters_are_scored_on_the_items_they_were_not_fitted_on(tmp_path):
    def same_set():
        old, new = rotated_back_pair()
        return (CellFeatures(old.gallery, old.gallery_labels, old.gallery, old.gallery_labels),
                CellFeatures(new.gallery, new.gallery_labels, new.gallery, new.gallery_labels))

    _, report, plan, _ = run(tmp_path, same_set, "--adapters", "procrustes")
    (row,) = plan["adapters"]
    assert report["same_set"] and row["pairs"] == 100 and row["n_queries"] == row["n_gallery"] == 100
    assert any("fitted ones left out of queries and gallery" in n for n in plan["notes"])


@pytest.mark.parametrize("args, message", [
    (["--threshold", "nan"], "--threshold must be a finite score"),  # the decision is taken on every check
    (["--plan", "{tmp}/nowhere/plan"], "does not exist"),
    (["--plan", "{tmp}/taken"], "taken.json exists"),
    (["--plan", "{outside}/plan"], "outside the data roots"),
    (["--plan", "{tmp}/plan", "--fit-share", "1"], "--fit-share must lie strictly between 0 and 1"),
    (["--plan", "{tmp}/plan", "--adapters", "rotation"], "unknown adapter kind 'rotation'"),
    (["--plan", "{tmp}/plan", "--threshold", "nan"], "--threshold must be a finite score"),
    (["--plan", "{tmp}/plan", "--adapter", "{tmp}/f"], "adapter.json"),
    (["--plan", "{tmp}/r"], "is one of --plan's files"),
])
def test_bad_plan_targets_are_refused_in_one_line_before_any_work(tmp_path, tmp_path_factory, capsys, args, message):
    folder = write_folder(tmp_path / "f", *compatible_pair())
    (tmp_path / "taken.json").write_text("{}")
    outside = tmp_path_factory.mktemp("outside")
    args = [a.format(tmp=tmp_path, outside=outside) for a in args]
    assert main(["check-upgrade", "--features", str(folder), "--json", str(tmp_path / "r.json"), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "taken.json"] and not list(outside.iterdir())
    assert (tmp_path / "taken.json").read_text() == "{}"


def test_sources_form_refuses_adapter_options(tmp_path, capsys):
    args = ["check-upgrade", "--old-gallery", str(tmp_path / "g.npz"), "--old-queries", str(tmp_path / "q.npz"),
            "--new-queries", str(tmp_path / "n.npz"), "--plan", str(tmp_path / "plan"), "--adapters", "procrustes"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "need the new gallery (--new-gallery)" in err and "\n" not in err.strip()
    assert not list(tmp_path.iterdir())


def test_sources_form_without_the_new_gallery_plans_from_the_verdicts_alone(tmp_path, capsys):
    from support.upgrade_sources import embeddings, tables, write_all

    specs = write_all("npz", tmp_path / "s", tables(embeddings(), text=True))
    args = ["check-upgrade", "--old-gallery", specs.old_gallery, "--old-queries", specs.old_queries, "--new-queries",
            specs.new_queries, "--resamples", "200", "--json", str(tmp_path / "r.json"), "--plan", str(tmp_path / "plan")]
    code = main(args)
    report = json.loads((tmp_path / "r.json").read_text())
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert code == {"compatible": 0, "not compatible": 1, "too close to call": 3}[report["verdict"]]
    assert plan["decision"] == migration_plan(report).decision and plan["adapters"] == [] == plan["rollouts"]
    assert plan["threshold"] is None and any("decided from the verdicts alone" in n for n in plan["notes"])
    same_decision((tmp_path / "plan.md").read_text(), plan)


def test_sources_form_with_the_new_gallery_fits_the_adapters(tmp_path, capsys):
    """The default adapters fitted on the galleries' pairs and the threshold (tests/test_source_remedies.py checks the
    numbers), the backfill rows as roll-outs."""
    from support.upgrade_sources import embeddings, tables, write_all

    specs = write_all("npz", tmp_path / "s", tables(embeddings(), text=True))
    args = ["check-upgrade", "--old-gallery", specs.old_gallery, "--old-queries", specs.old_queries, "--new-queries",
            specs.new_queries, "--new-gallery", specs.new_gallery, "--resamples", "200", "--json", str(tmp_path / "r.json"),
            "--plan", str(tmp_path / "plan")]
    code = main(args)
    report = json.loads((tmp_path / "r.json").read_text())
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert code == {"compatible": 0, "not compatible": 1, "too close to call": 3}[report["verdict"]]
    assert [a["name"] for a in plan["adapters"]] == list(DEFAULT_ADAPTERS)
    assert plan["rollouts"] == report["backfill"] and plan["threshold"] is not None
    assert not any("decided from the verdicts alone" in n for n in plan["notes"])
    same_decision((tmp_path / "plan.md").read_text(), plan)
