"""One decision on every path: the same stored pair checked from a features folder, a stored experiment, the stored
``upgrade`` analysis (the page's), Parquet sources and the page itself gives one decision (engine.upgrade.plan)."""
from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.app_pages import open_page, unplain
from support.upgrade import compatible_pair, incompatible_pair
from support.upgrade_cli import store_pair, write_folder
from support.upgrade_plan_cli import rotated_back_pair
from support.upgrade_sources import fixed_list

from engine.cli import main
from engine.core.contract import analysis_key
from engine.jobs.analysis import run_analysis
from engine.metrics.compatibility import CellFeatures
from engine.upgrade.plan import migration_plan
from storage import get_engine, load_analysis, session_scope, set_experiment_status

RESAMPLES = "300"


def parquet_sources(folder, old: CellFeatures, new: CellFeatures) -> list[str]:
    """The pair as four Parquet tables (id, vector, label), each side in a shuffled order, for --old-gallery."""
    folder.mkdir()
    rng = np.random.default_rng(1)
    args = []
    for flag, vectors, labels in (("--old-gallery", old.gallery, old.gallery_labels),
                                  ("--new-gallery", new.gallery, new.gallery_labels),
                                  ("--old-queries", old.query, old.query_labels),
                                  ("--new-queries", new.query, new.query_labels)):
        order = rng.permutation(len(labels))
        pq.write_table(pa.table({"doc": np.arange(len(labels))[order], "emb": fixed_list(vectors[order].astype(np.float32)),
                                 "cls": np.asarray(labels)[order]}), folder / f"{flag[2:]}.parquet")
        args += [flag, f"parquet:{folder / f'{flag[2:]}.parquet'}#id=doc&vector=emb&label=cls"]
    return args


def decided(tmp_path, capsys, args: list[str], name: str) -> dict:
    """The plan a check-upgrade command wrote (--plan), after checking it printed the same decision line."""
    code = main(["check-upgrade", *args, "--resamples", RESAMPLES, "--plan", str(tmp_path / name)])
    assert code in (0, 1, 3), capsys.readouterr().err
    plan = json.loads((tmp_path / f"{name}.json").read_text())
    assert f"  decision: {plan['headline']}: {plan['reason']}" in capsys.readouterr().out.splitlines()
    return plan


def every_path(tmp_path, capsys, app_db, pair) -> dict[str, dict]:
    old, new = pair()
    folder = write_folder(tmp_path / "f", old, new)
    exp = store_pair(app_db, old, new, names=("v1", "v2"))
    with session_scope(get_engine(app_db)) as s:
        set_experiment_status(s, exp, "done")
    plans = {"features": decided(tmp_path, capsys, ["--features", str(folder), "--name", "v1", "--name", "v2"], "f"),
             "experiment": decided(tmp_path, capsys, ["--experiment", str(exp), "--old-step", "1", "--new-step", "2",
                                                      "--db", app_db], "e"),
             "sources": decided(tmp_path, capsys, [*parquet_sources(tmp_path / "pq", old, new), "--name", "v1",
                                                   "--name", "v2"], "s")}
    params = {"step_a": 1, "step_b": 2, "view": "encoder"}  # the page's defaults: the decision's metric, mAP
    run_analysis(get_engine(app_db), exp, "upgrade", params)
    with session_scope(get_engine(app_db)) as s:
        payload = load_analysis(s, exp, "upgrade", analysis_key("upgrade", params)).payload
    plans["analysis"] = payload["plan"]
    again = migration_plan(payload["report"], adapters=payload["plan"]["adapters"], rollouts=payload["plan"]["rollouts"],
                           threshold=payload["plan"]["threshold"])
    assert again.headline() == payload["plan"]["headline"]  # the stored plan is the decision function's output
    at = open_page("upgrade")
    assert not at.exception
    boxes = [unplain(b.value) for b in at.info if unplain(b.value).startswith("Decision: ")]
    assert boxes and boxes[0] == f"Decision: {payload['plan']['headline']}. {payload['plan']['reason']}"
    return plans


@pytest.mark.slow
def test_a_pair_not_better_on_its_own_is_not_shipped_and_never_backfilled_on_any_path(tmp_path, capsys, app_db):
    """A rotated copy: as good as v1 alone, useless on v1's gallery. Every path says do not ship; none backfills,
    although each measures backfill curves that reach v1's self-test."""
    plans = every_path(tmp_path, capsys, app_db, incompatible_pair)
    assert {p["decision"] for p in plans.values()} == {"do not ship"}
    assert all(p["items_to_reembed"] == 0 and p["ordering"] is None for p in plans.values())
    assert all(p["metric"] in ("map", "map@10") and p["success"] == "not better" for p in plans.values())


@pytest.mark.slow
def test_an_exact_rotation_back_ships_with_an_adapter_on_every_path(tmp_path, capsys, app_db):
    """v2 = v1's gallery rotated, with better queries: not compatible as is, better alone, and an adapter fitted on the
    gallery pairs undoes the rotation. Every path, Parquet sources included, ships with an adapter."""
    plans = every_path(tmp_path, capsys, app_db, rotated_back_pair)
    assert {p["decision"] for p in plans.values()} == {"ship with adapter"}
    assert {p["guardrail"] for p in plans.values()} == {"not compatible"}
    assert {p["success"] for p in plans.values()} == {"better"}
    for p in plans.values():  # recovery against its ceiling: every adapter row carries both shares and the ceiling
        assert {r["name"] for r in p["recovery"]} == {a["name"] for a in p["adapters"]}
        for r, a in zip(p["recovery"], p["adapters"]):
            report = p["report"] if "report" in p else None
            if report is not None:
                assert r["ceiling"] == pytest.approx(report["old_old"] / report["new_new"], abs=1e-12)
                assert r["share_of_old_old"] == pytest.approx(a["adapted_old"] / report["old_old"], abs=1e-12)
            assert a["label_free"] is not None and 0 <= a["label_free"] <= 1


def test_the_label_free_reading_beside_an_adapter_is_neighbour_recall_by_hand(tmp_path):
    """The in-memory adapter row's label_free: the adapted queries' top-10 on the old gallery against the new model's
    own top-10, by a numpy search (cosine)."""
    from engine.adapters.posthoc import fit_map
    from engine.upgrade.migration import label_free

    old, new = compatible_pair()
    m = fit_map("procrustes", new.gallery[:100], old.gallery[:100])
    unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)  # noqa: E731
    ref = np.argsort(-(unit(new.query) @ unit(new.gallery).T), axis=1, kind="stable")[:, :10]
    got = np.argsort(-(unit(m.apply(new.query)) @ unit(old.gallery).T), axis=1, kind="stable")[:, :10]
    by_hand = np.mean([len(set(a) & set(b)) / 10 for a, b in zip(got, ref)])
    assert label_free(m, old, new) == pytest.approx(by_hand, abs=1e-12)
