"""``check-upgrade --report OUT.html|OUT.md`` and :mod:`engine.upgrade.release_report`: the plan's decision first, every
number with its interval, secrets masked, every string escaped, nothing fetched, the cost of each option, unknown plan
fields listed, and every bad target refused in one line before any work (numbers by hand with numpy)."""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.upgrade import hits
from support.upgrade_cli import write_folder
from support.upgrade_plan_cli import rotated_back_pair

from engine.cli import main
from engine.upgrade.plan import migration_plan
from engine.upgrade.release_report import option_costs, report_context, report_data, report_html, report_markdown
from support.release_report import EXTERNAL

HOSTILE = "<script>alert(1)</script>"
SECRET = "hunter2"


def check(tmp_path, *extra: str, names=("v1", "v2")) -> tuple[int, dict, str]:
    """A tiny features check (a generated step_1/step_2 folder) with --json and the given options."""
    folder = tmp_path / "f" if (tmp_path / "f").exists() else write_folder(tmp_path / "f", *rotated_back_pair())
    code = main(["check-upgrade", "--features", str(folder), "--name", names[0], "--name", names[1], "--resamples", "200",
                 "--metric", "recall@1", "--json", str(tmp_path / "r.json"), *extra])  # the pair's hits, by hand
    return code, json.loads((tmp_path / "r.json").read_text()), str(folder)


def test_the_html_report_puts_the_plans_decision_first_with_every_number_and_its_interval(tmp_path, capsys):
    code, report, folder = check(tmp_path, "--report", str(tmp_path / "out.html"), "--plan", str(tmp_path / "plan"))
    assert code == 1  # --report leaves the exit code as it is
    plan = json.loads((tmp_path / "plan.json").read_text())
    page = (tmp_path / "out.html").read_text()
    decision = f"Decision: {plan['headline']}."
    assert plan["decision"] == "ship with adapter" and decision == "Decision: ship with adapter procrustes."
    body = page[page.index("<body>"):]
    assert body.index(decision) < body.index(report["sentence"].split(":")[0]) < body.index("<h2>Inputs</h2>")
    assert body.index(decision) < min(body.index(f"<h2>{h}</h2>") for h in ("Inputs", "Rule", "Numbers", "Cost of each option"))
    old, new = rotated_back_pair()
    c = report["compatibility"]
    assert report["old_old"] == pytest.approx(hits(old, old).mean()) and report["new_old"] == pytest.approx(hits(new, old).mean())
    for number in (f"{100 * hits(old, old).mean():.1f}%", f"{100 * hits(new, old).mean():.1f}%",  # by hand
                   f"{100 * c['diff']:+.1f} pts", f"{100 * c['lo']:+.1f} to {100 * c['hi']:+.1f}"):
        assert number in page
    for a in plan["adapters"]:
        ac = a["compatibility"]
        assert f"{100 * ac['lo']:+.1f} to {100 * ac['hi']:+.1f}" in page and f"{100 * a['adapted_old']:.1f}%" in page
    assert "<h2>Backfill curves</h2>" in page and page.count("<svg") == 2  # the gain chart and the curves, inline
    assert "compatlab" in page and "<h2>Rule</h2>" in page and "strict ECC" in page
    assert f"<td>features</td><td>{folder}</td>" in page and "<td>gallery items</td><td>200</td>" in page
    assert "python -m engine check-upgrade --features" in page  # the command line as given
    assert "x @ W (+ b)" in page  # the adapters' orientation
    assert "<li>" in page and "**" not in page and "- note:" not in page  # lists are lists, no literal Markdown
    assert not EXTERNAL.search(page) and "<script" not in page.lower() and "<link" not in page.lower()
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert "  report: ship with adapter procrustes (written to out.html)" in capsys.readouterr().out.splitlines()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "out.html", "plan.json", "plan.md", "r.json"]


def test_markdown_by_the_suffix_without_plan_has_the_same_decision(tmp_path):
    code, report, _ = check(tmp_path, "--report", str(tmp_path / "out.md"))
    text = (tmp_path / "out.md").read_text()
    lines = [x for x in text.splitlines() if x]
    assert lines[0] == "# Upgrade report: v1 -> v2"
    assert lines[1].startswith("**Decision: ship with adapter procrustes.** Adapter procrustes maps v2")
    c = report["compatibility"]
    assert f"| {100 * c['diff']:+.1f} pts | {100 * c['lo']:+.1f} to {100 * c['hi']:+.1f} | not compatible |" in text
    assert "| ship with adapter procrustes (the plan's choice) | 0 | none |" in text.replace("→ ", "")
    assert "Throughput unknown" in text and "<svg" not in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "out.md", "r.json"]  # no plan files without --plan


def test_a_hostile_model_name_is_escaped_everywhere(tmp_path, monkeypatch):
    code, report, _ = check(tmp_path, "--report", str(tmp_path / "out.html"), names=("v1", HOSTILE))
    page = (tmp_path / "out.html").read_text()
    assert report["new_name"] == HOSTILE
    assert "<script" not in page.lower() and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert not EXTERNAL.search(page)
    plan = migration_plan(report)  # a plan from the verdicts alone, as a stored check from a store has
    md = report_markdown(report_data({**plan.to_json(), "headline": plan.headline()}, report, report_context(inputs={})))
    assert not re.search(r"(?<!\\)<", md) and "\\<script>alert(1)\\</script>" in md  # every < escaped


def test_the_command_line_and_the_sources_are_masked(tmp_path, monkeypatch):
    url = f"postgresql://admin:{SECRET}@db.internal/lab"
    monkeypatch.setattr(sys, "argv", ["engine"])  # main(argv) passes its own argv: this one must not be used
    check(tmp_path, "--db", url, "--report", str(tmp_path / "out.html"))
    page = (tmp_path / "out.html").read_text()
    assert SECRET not in page and "postgresql://admin:***@db.internal/lab" in page
    context = report_context(command=["check-upgrade", "--old-gallery", f"sql:{url}#table=items&token={SECRET}",
                                      f"--db={url}", "s3://key:" + SECRET + "@bucket/x.parquet?password=" + SECRET],
                             inputs={"sources": {"old_gallery": f"sql:{url}#table=items&api_key={SECRET}"}, "database": url})
    data = report_data(None, json.loads((tmp_path / "r.json").read_text()), context)
    for text in (report_html(data, draw=lambda spec: None), report_markdown(data).replace("\\", "")):  # md: \* is *
        assert SECRET not in text and "admin:***@db.internal" in text and "key:***@bucket" in text
        assert "token=***" in text and "api_key=***" in text and "password=***" in text


def test_unknown_plan_fields_are_listed_and_the_costs_use_the_measured_throughput(tmp_path):
    _, report, _ = check(tmp_path, "--plan", str(tmp_path / "plan"), "--rollout")
    plan = json.loads((tmp_path / "plan.json").read_text())
    plan.update(decision_metric="map", rule="strict ECC on mAP", beside={"map": {"diff": 0.012, "verdict": "better"}},
                equivalence={"margin": 1.0, "reading": "equivalent within 1 point"})
    for a in plan["adapters"]:
        a.update(share_of_new_new=0.987, share_of_old_old=1.2, cap=None, label_free=False)
    embedding = [{"model": "v1", "unit": "images", "items": 300, "seconds": 9.0, "device": "cpu", "cached": 0},
                 {"model": "v2", "unit": "images", "items": 100, "seconds": 2.0, "device": "cpu", "cached": 0}]
    data = report_data(plan, plan.pop("report"), report_context(inputs={"features": "f"}, embedding=embedding))
    html_text, md = report_html(data, draw=lambda spec: None), report_markdown(data)
    for text in (html_text, md):
        assert "equivalent within 1 point" in text and "strict ECC on mAP" in text and "0.987" in text and "1.2" in text
        assert "Measured embedding throughput of v2: 50.0 images/s" in text  # 100 images in 2 s: v2 re-embeds
    costs = {o["option"]: o for o in option_costs(data)}
    whole = costs["re-embed the whole gallery with v2"]
    assert whole["items"] == 200 and whole["seconds"] == pytest.approx(200 / 50)
    chosen = [o for o in costs.values() if o["chosen"]]
    assert [o["option"] for o in chosen] == ["ship with adapter procrustes"] and chosen[0]["items"] == 0
    rolled = [o for o in option_costs(data) if o["option"].startswith(("backfill", "rank merge"))]
    by_hand = [None if r["to_old_self"] is None else math.ceil(r["to_old_self"] * 200 - 1e-9) for r in plan["rollouts"]]
    assert [o["items"] for o in rolled] == by_hand and any(n for n in by_hand)
    assert all(o["seconds"] == pytest.approx(o["items"] / 50) for o in rolled if o["items"])
    assert "throughput unknown" in report_markdown({**data, "context": report_context(inputs={})})


def test_a_check_without_a_plan_says_so_and_still_renders(tmp_path):
    _, report, _ = check(tmp_path)
    data = report_data({"error": "a fit share of 0.5 of 2 gallery items gives 1 pairs"}, report,
                       report_context(inputs={}))
    assert "No migration plan." in report_html(data, draw=lambda spec: None)
    assert report_markdown(data).splitlines()[2].startswith("**No migration plan.** a fit share of 0.5")


@pytest.mark.parametrize("target, message", [
    ("{tmp}/taken.html", "exists; give a new name"),
    ("{tmp}/folder.html", "is a folder"),
    ("{tmp}/out.pdf", "give a file name ending in .html, .htm, .md"),
    ("{tmp}/out", "give a file name ending in"),
    ("{tmp}/nowhere/out.html", "does not exist"),
    ("{outside}/out.html", "outside the data roots"),
    ("{tmp}/r.json.md", None),  # a fine name: the control
])
def test_bad_report_targets_are_refused_in_one_line_before_any_work(tmp_path, tmp_path_factory, capsys, target, message):
    folder = write_folder(tmp_path / "f", *rotated_back_pair())
    (tmp_path / "taken.html").write_text("mine")
    (tmp_path / "folder.html").mkdir()
    outside = tmp_path_factory.mktemp("outside")
    out = target.format(tmp=tmp_path, outside=outside)
    code = main(["check-upgrade", "--features", str(folder), "--resamples", "50", "--metric", "recall@1", "--report", out])
    if message is None:
        assert code == 1 and Path(out).is_file()
        return
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: --report") and message in err and "\n" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "folder.html", "taken.html"] and not list(outside.iterdir())
    assert (tmp_path / "taken.html").read_text() == "mine" and not list((tmp_path / "folder.html").iterdir())


@pytest.mark.parametrize("args, message", [
    (["--json", "{tmp}/same.md", "--report", "{tmp}/same.md"], "is also another output"),
    (["--experiment", "1", "--text-summary", "--report", "{tmp}/r.html"], "leave out --report"),
    (["--features", "{tmp}/f", "--threshold", "nan"], "--threshold must be a finite score"),
])
def test_report_option_clashes_are_one_line(tmp_path, capsys, args, message):
    write_folder(tmp_path / "f", *rotated_back_pair())
    args = [a.format(tmp=tmp_path) for a in args]
    if "--features" not in args and "--experiment" not in args:
        args = ["--features", str(tmp_path / "f"), *args]
    assert main(["check-upgrade", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_plan_options_shape_the_reports_plan_without_plan_files(tmp_path):
    check(tmp_path, "--report", str(tmp_path / "out.md"), "--adapters", "affine", "--threshold", "0.5")
    text = (tmp_path / "out.md").read_text()
    assert "adapter affine" in text and "adapter procrustes" not in text and "- 0.5 under v1" in text


def test_the_module_imports_no_torch_and_no_chart_library_until_it_draws():
    code = ("import sys, engine.upgrade.release_report; "
            "print([m for m in ('torch', 'vl_convert', 'altair') if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1]).stdout
    assert out.strip() == "[]"


def test_a_throughput_is_only_read_off_what_this_run_embedded():
    cached = [{"model": "v1", "unit": "texts", "items": 0, "seconds": 0.0, "device": "cpu", "cached": 160},
              {"model": "v2", "unit": "texts", "items": 0, "seconds": 0.0, "device": "cpu", "cached": 160}]
    context = report_context(inputs={}, embedding=cached)
    assert context["throughput"] is None and "read from the embedding cache" in context["throughput_note"]
    given = report_context(inputs={})
    assert given["throughput"] is None and given["throughput_note"] == "this check read embeddings that were already computed"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00", given["created"]) and given["command"] is None


def test_without_plan_a_gallery_too_small_for_an_adapter_still_gets_its_report(tmp_path, capsys):
    from support.upgrade import close_pair

    folder = write_folder(tmp_path / "f", *close_pair())  # two gallery items: one pair is not enough to fit on
    assert main(["check-upgrade", "--features", str(folder), "--resamples", "50", "--metric", "recall@1",
                 "--report", str(tmp_path / "r.md")]) == 3
    text = (tmp_path / "r.md").read_text()
    # decided from the verdicts alone, saying why (as the stored analysis and every other path)
    assert text.index("**Decision: do not ship yet.**") < text.index("no adapter, roll-out or threshold: a fit share of "
                                                                       "0.5 of 2 gallery items gives 1 pairs")
    assert "  report: do not ship yet (written to r.md)" in capsys.readouterr().out.splitlines()
