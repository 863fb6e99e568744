"""``python -m engine check-upgrade --features DIR``: exit codes 0 / 1 / 3 / 2, the JSON report, nothing half-written."""
from __future__ import annotations

import json

import numpy as np
import pytest
from test_upgrade import close_pair, compatible_pair, incompatible_pair

from engine.cli import main


def write_folder(path, *sets, extra=None):
    path.mkdir()
    for i, s in enumerate(sets, 1):
        np.savez(path / f"step_{i}.npz", query_features=s.query, query_labels=s.query_labels,
                 gallery_features=s.gallery, gallery_labels=s.gallery_labels, **(extra or {}))
    return path


@pytest.mark.parametrize("pair, code, verdict", [(compatible_pair, 0, "compatible"), (incompatible_pair, 1, "not compatible"),
                                                 (close_pair, 3, "too close to call")])
def test_exit_code_is_the_verdict(tmp_path, capsys, pair, code, verdict):
    folder = write_folder(tmp_path / "f", *pair())
    out = tmp_path / "report.json"
    assert main(["check-upgrade", "--features", str(folder), "--name", "v1", "--name", "v2", "--json", str(out)]) == code
    report = json.loads(out.read_text())
    assert report["verdict"] == verdict and report["old_name"] == "v1" and report["new_name"] == "v2"
    assert report["bootstrap"] == {"method": "percentile", "paired_over": "queries", "resamples": 1000, "level": 0.95, "seed": 0}
    assert capsys.readouterr().out.splitlines()[0] == report["sentence"]
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


def test_help_says_only_features_for_now(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["check-upgrade", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "Only the --features form is available for now" in text and "--experiment ID" in text
    with pytest.raises(SystemExit) as exit_:
        main(["check-upgrade"])
    assert exit_.value.code == 2
