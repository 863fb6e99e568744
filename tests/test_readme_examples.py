"""The README's copy-paste examples run as written (each ```bash block under an ``<!-- example: NAME -->`` marker), in
a fresh folder with the checkout's ``examples/`` beside it, and print what the README says they print."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from support.offline_text import needs_text_models

ROOT = Path(__file__).resolve().parents[1]
EXPECT = {  # what each example's output must show (the README's words about it)
    "engineer": ["is not compatible with L3", "On its own L6 scores", "plan forecast: a Procrustes adapter should recover",
                 "  decision: "],
    "researcher": ["AC=", "minilm_l6 → minilm_l3: not compatible"],
    "teacher": ["learnable", "fixed", "mean_abs_drift_deg"],
}


def examples() -> dict[str, str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    found = dict(re.findall(r"<!-- example: (\w+) -->\n```bash\n(.*?)```", text, re.DOTALL))
    assert set(found) == set(EXPECT), f"README examples {sorted(found)} vs tested {sorted(EXPECT)}"
    return found


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(EXPECT))
def test_the_readme_example_runs_as_written(name, tmp_path):
    script = examples()[name]
    if name in ("engineer", "researcher") and (why := needs_text_models()):
        pytest.skip(why)
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {**os.environ, "COMPATLAB_DATA_ROOTS": str(tmp_path), "COMPATLAB_DB_URL": f"sqlite:///{tmp_path / 'lab.db'}",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=900)
    assert out.returncode in (0, 1, 3), out.stderr[-2000:]  # check-upgrade's exit code is the verdict
    for expected in EXPECT[name]:
        assert expected in out.stdout, (expected, out.stdout[-3000:])
    if name == "engineer":
        assert {"plan.json", "plan.md", "release.html"} <= {p.name for p in (tmp_path / "data" / "store").iterdir()}
