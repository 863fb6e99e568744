"""The dashboard's text-upgrade demo as the worker runs it, cold then warm in one run.

The spec is the one the dashboard queues: the Checkpoints page is run through streamlit's ``AppTest``, "Check a
text-embedding upgrade" clicked and launched, and the queued ``checkpoints`` job's payload read back from the queue.
It is then given to the job's handler (``engine.jobs.job_handlers.checkpoints_job``, what the worker calls, with the
worker's thread count) twice: cold (an empty text embedding cache: the run works in a new temporary folder, whose
``./data`` is the first data root) and warm (the cache the cold run filled). Printed: wall time of each, per model
the time from its loading to the next step and texts/s over it (load + embed; cached texts count as done), the ratio
cold/warm, the load average before and after and the peak RSS of the process.

    python bench/bench_text_demo.py                 # the preset's default corpus
    python bench/bench_text_demo.py --dataset wordnet:task=qrels,queries=100,gallery=400,seed=0,train=100   # a quick look
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import tempfile
import time
from pathlib import Path

PAGE = Path(__file__).resolve().parents[1] / "app" / "app_pages" / "checkpoints.py"


def preset_spec(db_url: str) -> dict:
    """The spec the dashboard's text-upgrade entry queues (clicked on the Checkpoints page, read from the queue)."""
    from streamlit.testing.v1 import AppTest

    from storage import get_engine, list_jobs, session_scope

    at = AppTest.from_file(str(PAGE), default_timeout=120).run()
    at.button(key="ck_use_text").click().run()
    at.button(key="ck_launch").click().run()
    if at.exception or at.error:
        raise SystemExit(f"the Checkpoints page did not queue the preset: {[e.value for e in at.error] or at.exception}")
    with session_scope(get_engine(db_url)) as s:
        queued = [dict(j.payload) for j in list_jobs(s) if j.kind == "checkpoints"]
    return queued[-1]["spec"]


def run_once(db, spec: dict, n_texts: int) -> tuple[float, dict[str, float]]:
    """Wall seconds of one ``checkpoints`` job and each model's seconds from its loading to the next step."""
    from engine.jobs.job_handlers import JobContext, checkpoints_job

    marks: list[tuple[float, str]] = []
    started = time.perf_counter()
    checkpoints_job(db, {"spec": spec}, JobContext(progress=lambda f, m: marks.append((time.perf_counter(), m)),
                                                   should_stop=lambda: False, checkpoint_dir=None))
    wall = time.perf_counter() - started
    starts = [(t, m.split()[1]) for t, m in marks if m.startswith("loading ")]
    ends = [t for t, m in marks if m.startswith(("loading ", "computing compatibility"))][1:]
    per_model = {label: end - t for (t, label), end in zip(starts, ends)}
    cached = sum(m.endswith("texts cached") for _, m in marks)
    print(f"  wall {wall:7.1f} s  (reading WordNet {starts[0][0] - started:.1f} s, matrices + store "
          f"{started + wall - ends[-1]:.1f} s; {cached} (model, split) read from the cache)")
    for label, seconds in per_model.items():
        print(f"  {label:16s} {seconds:7.1f} s  {n_texts / seconds:8.1f} texts/s (load + embed of {n_texts} texts)")
    return wall, per_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dataset", help="replace the preset's corpus (e.g. a smaller one for a quick look)")
    args = p.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-text-demo-"))
    os.chdir(folder)  # ./data here is the first data root: the cache starts empty
    try:
        bench(folder, args.dataset)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def bench(folder: Path, dataset: str | None) -> None:
    """Queue the preset in a database in ``folder``, then run its job cold and warm (see the module docstring)."""
    db_url = f"sqlite:///{folder / 'compatlab.db'}"
    os.environ["COMPATLAB_DB_URL"] = db_url
    from engine.core import threads
    from engine.checkpoints.text_cache import default_folder
    from engine.data.wordnet import parse_options
    from storage import get_engine, init_db

    db = get_engine(db_url)
    init_db(db)
    spec = preset_spec(db_url)
    if dataset:
        spec["dataset"] = dataset
    options = parse_options(spec["dataset"].partition(":")[2])
    n_texts = options.queries + options.gallery + 2 * options.train
    used = threads.apply(threads.per_process(processes=1))  # what the worker gives its one running job
    load_before = os.getloadavg()
    print(f"{spec['name']}: {' -> '.join(m['label'] for m in spec['models'])} on {spec['dataset']} "
          f"({n_texts} texts per model), {used['torch']} thread(s); load average {load_before[0]:.2f}")
    print("cold (empty cache):")
    cold, cold_models = run_once(db, spec, n_texts)
    files = sorted(default_folder().rglob("*.npy"))
    print(f"  cache: {len(files)} files, {sum(f.stat().st_size for f in files) / 2**20:.1f} MiB in {default_folder()}")
    print("warm (the same spec again):")
    warm, warm_models = run_once(db, spec, n_texts)
    load_after = os.getloadavg()
    print(f"cold/warm: x{cold / warm:.1f} wall; per model " +
          ", ".join(f"{k} x{cold_models[k] / warm_models[k]:.1f}" for k in cold_models))
    print(f"load average {load_before[0]:.2f} before, {load_after[0]:.2f} after (1-minute); peak RSS "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
    main()
