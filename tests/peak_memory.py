"""Run a snippet in a fresh interpreter and measure how much its peak RSS (VmHWM) grew while it ran.

The child sets an address-space limit of its size after the imports plus ``headroom`` plus 500 MB, so a regression
that tries to allocate gigabytes fails fast with a MemoryError instead of swapping the shared machine.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MB = 1_000_000

_WRAPPER = textwrap.dedent("""
    import json, resource, sys

    def _status(field):
        return next(int(line.split()[1]) * 1000 for line in open("/proc/self/status") if line.startswith(field + ":"))

    ARGS = json.loads(sys.argv[1])
    exec(ARGS["setup"])
    limit = _status("VmSize") + ARGS["headroom"] + 500_000_000
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    base = _status("VmHWM")
    try:
        result, error = eval(ARGS["expr"]), None
    except Exception as exc:
        result, error = None, f"{type(exc).__name__}: {exc}"
    print(json.dumps({"result": result, "error": error, "grew": _status("VmHWM") - base}, default=repr))
""")


def measure(setup: str, expr: str, *, headroom: int, env: dict[str, str] | None = None) -> dict:
    """Run ``setup`` (imports; not measured), then evaluate ``expr``: its JSON-able ``result`` or its ``error``
    (``Type: message``), and ``grew``, the bytes its peak RSS grew by."""
    args = {"setup": textwrap.dedent(setup), "expr": expr, "headroom": headroom}
    done = subprocess.run([sys.executable, "-c", _WRAPPER, json.dumps(args)], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", **(env or {})})
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])
