"""``python -m engine check-upgrade --features DIR``: exit codes 0 / 1 / 3 / 2, the JSON report, nothing half-written."""
from __future__ import annotations

import json

import numpy as np
import pytest
from support.upgrade import close_pair, compatible_pair, incompatible_pair

from engine.cli import main
from engine.metrics.compatibility import CellFeatures
from engine.upgrade.verdict import check_upgrade
from support.upgrade_cli import store_pair, write_folder




@pytest.mark.parametrize("pair, code, verdict", [(compatible_pair, 0, "compatible"), (incompatible_pair, 1, "not compatible"),
                                                 (close_pair, 3, "too close to call")])
def test_exit_code_is_the_verdict(tmp_path, capsys, pair, code, verdict):
    folder = write_folder(tmp_path / "f", *pair())
    out = tmp_path / "report.json"
    assert main(["check-upgrade", "--features", str(folder), "--name", "v1", "--name", "v2", "--metric", "recall@1",
                 "--json", str(out)]) == code
    report = json.loads(out.read_text())
    assert report["verdict"] == verdict and report["old_name"] == "v1" and report["new_name"] == "v2"
    assert report["bootstrap"] == {"method": "percentile", "paired_over": "queries and gallery items", "resamples": 1000,
                                   "level": 0.95, "seed": 0}
    assert report["rule"] == "strict ECC (cross-test > self-test, the papers' rule)"
    assert capsys.readouterr().out.splitlines()[0] == report["sentence"]
    assert f"over {report['compatibility']['n']} queries and {report['n_gallery']:,} gallery items)" in report["sentence"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f", "report.json"]


@pytest.mark.parametrize("make, args, message", [
    (lambda p: write_folder(p, *compatible_pair(), compatible_pair()[0]), [], "compares two models"),
    (lambda p: write_folder(p, *compatible_pair()), ["--name", "v1"], "two model names"),
    (lambda p: write_folder(p, *compatible_pair()), ["--metric", "verification"], "unknown metric"),
    (lambda p: write_folder(p, *compatible_pair()), ["--level", "2"], "confidence level"),
    (lambda p: write_folder(p, *compatible_pair(), extra={"x": np.zeros(1)}), [], "unexpected array"),
    (lambda p: p, [], "not a folder"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, make, args, message):
    folder = make(tmp_path / "f")
    out = tmp_path / "report.json"
    assert main(["check-upgrade", "--features", str(folder), "--json", str(out), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err
    assert not out.exists()


def test_json_target_problems_are_refused_before_any_work(tmp_path, capsys):
    folder = write_folder(tmp_path / "f", *compatible_pair())
    assert main(["check-upgrade", "--features", str(folder), "--json", str(tmp_path / "no" / "r.json")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["check-upgrade", "--features", str(folder), "--json", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]


def test_help_names_both_forms(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["check-upgrade", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--features DIR" in text and "--experiment ID --old-step A --new-step B" in text
    assert "--model OLD --model NEW --dataset NAME[:ROOT]" in text
    with pytest.raises(SystemExit) as exit_:
        main(["check-upgrade"])
    assert exit_.value.code == 2


# ------------------------------------------------------------------------------ --experiment ID --old-step A --new-step B




@pytest.mark.parametrize("pair, code, verdict", [(compatible_pair, 0, "compatible"), (incompatible_pair, 1, "not compatible"),
                                                 (close_pair, 3, "too close to call")])
def test_experiment_form_exit_code_is_the_verdict(tmp_path, capsys, pair, code, verdict):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    old, new = pair()
    exp = store_pair(url, old, new, names=("v1", "v2"))
    out = tmp_path / "r.json"
    args = ["check-upgrade", "--experiment", str(exp), "--old-step", "1", "--new-step", "2", "--db", url, "--metric", "recall@1",
            "--json", str(out)]
    assert main(args) == code
    report = json.loads(out.read_text())
    # the same verdict as the --features form computes on the same arrays (float32 as stored)
    as32 = lambda c: CellFeatures(c.query.astype(np.float32), c.query_labels, c.gallery.astype(np.float32), c.gallery_labels)  # noqa: E731
    direct = check_upgrade(as32(old), as32(new), names=("v1", "v2"))
    assert report["verdict"] == verdict == direct.verdict
    assert report["compatibility"]["diff"] == pytest.approx(direct.compatibility.diff)
    assert (report["old_name"], report["new_name"], report["experiment_id"]) == ("v1", "v2", exp)
    assert capsys.readouterr().out.splitlines()[0] == report["sentence"]


def test_experiment_form_names_default_to_steps(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    exp = store_pair(url, *compatible_pair())
    assert main(["check-upgrade", "--experiment", str(exp), "--old-step", "1", "--new-step", "2", "--db", url]) == 0
    assert capsys.readouterr().out.startswith("step 2 is compatible with step 1")


@pytest.mark.parametrize("args, message", [
    (["--experiment", "99", "--old-step", "1", "--new-step", "2"], "experiment 99 does not exist"),
    (["--experiment", "{exp}", "--old-step", "1", "--new-step", "5"], "no model of step 5"),
    (["--experiment", "{exp}", "--old-step", "1"], "needs --old-step A and --new-step B"),
    (["--experiment", "{exp}", "--old-step", "2", "--new-step", "2"], "two different steps"),
    (["--experiment", "{exp}", "--old-step", "1", "--new-step", "2", "--view", "psp"], "no 'query' features for view 'psp'"),
    (["--experiment", "{exp}", "--old-step", "1", "--new-step", "2", "--same-set"], "--same-set goes with --features"),
    (["--features", "{tmp}", "--old-step", "1"], "go with --experiment"),
])
def test_experiment_form_bad_input_is_one_line_and_exit_2(tmp_path, capsys, args, message):
    url = f"sqlite:///{tmp_path / 'x.db'}"
    exp = store_pair(url, *compatible_pair())
    out = tmp_path / "r.json"
    args = [a.format(exp=exp, tmp=tmp_path) for a in args]
    assert main(["check-upgrade", *args, "--db", url, "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and message in err and "\n" not in err
    assert not out.exists()


def test_experiment_and_features_are_exclusive(tmp_path):
    with pytest.raises(SystemExit) as exit_:
        main(["check-upgrade", "--experiment", "1", "--features", str(tmp_path)])
    assert exit_.value.code == 2


def test_rollout_and_orderings_options(tmp_path, capsys):
    """A rotated copy: new/new equals old/old, and so does every roll-out curve (the two indexes agree on every score)."""
    folder = write_folder(tmp_path / "f", *incompatible_pair())
    out = tmp_path / "report.json"
    args = ["check-upgrade", "--features", str(folder), "--resamples", "50", "--json", str(out)]
    assert main([*args, "--orderings", "random", "adapter_residual", "--rollout"]) == 1
    report = json.loads(out.read_text())
    assert [n["ordering"] for n in report["backfill"]] == ["random", "adapter_residual"]
    assert [n["ordering"] for n in report["rollout"]] == ["rank_merge:random", "rank_merge:adapter_residual", "rescoring"]
    for need in report["rollout"]:
        assert need["values"] == pytest.approx([report["old_old"]] * len(need["values"]), abs=1e-9)
        assert need["area"] == pytest.approx(report["old_old"]) and need["to_old_self"] == 0.0
    printed = capsys.readouterr().out
    assert "roll-out rank_merge:random" in printed and "roll-out rescoring" in printed
    assert main(args) == 1
    assert json.loads(out.read_text())["rollout"] == []
    capsys.readouterr()
    assert main([*args, "--orderings", "fastfill"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown backfilling order(s) fastfill; known: random,") and "\n" not in err
