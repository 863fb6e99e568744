"""What a 50,000-point-per-model feature map costs the dashboard, against the 5,000 it draws (same run).

For a synthetic stored map (2 models x N images, C classes) it times and sizes, for all N images and for
the display sample (``app.map_explore.display_sample``):
  * building the Altair chart and its Vega-Lite dict (what ``st.altair_chart`` does first),
  * the Arrow bytes Streamlit sends to the browser, and the JSON of a standalone (inline-data) spec,
  * rendering it once with vl-convert (the Vega renderer the browser runs, here in Deno; ``--no-render``
    skips it): a proxy for each redraw on pan, zoom or hover.
and, with ``--hits``, the worker's per-point top-1 search (``engine.analysis.map.top1_hits``) at N.

    python bench/bench_map.py [--n 50000] [--classes 30] [--dim 64] [--no-render] [--hits]
"""
from __future__ import annotations

import argparse
import io
import time

import altair as alt
import numpy as np
import pandas as pd
import pyarrow as pa

from app import charts
from app import map_explore as mx

MODELS = ["step 1 (old)", "step 2 (new)"]


def synthetic_points(n: int, classes: int, seed: int = 0) -> pd.DataFrame:
    """Two models' map points of ``n`` images in ``classes`` Gaussian blobs, with hit and drift."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % classes
    centres = rng.normal(size=(classes, 2)) * 6
    frames = []
    for m, name in enumerate(MODELS):
        xy = centres[labels] + rng.normal(size=(n, 2)) + m
        frames.append(pd.DataFrame({"x": xy[:, 0], "y": xy[:, 1], "model": name, "label": labels,
                                    "class": [f"class-{c}" for c in labels], "row": np.arange(n),
                                    "hit": rng.integers(0, 2, n).astype(float), "drift": rng.uniform(0, 1, n)}))
    return mx.with_colour_columns(pd.concat(frames, ignore_index=True), MODELS)


def measure(points: pd.DataFrame, render: bool) -> dict[str, float]:
    """Seconds to build the chart spec, Arrow / JSON megabytes, seconds to render one PNG."""
    empty = points.iloc[:0]
    start = time.perf_counter()
    chart = charts.projection_chart(points, empty, empty, empty, model_names=MODELS, title="map", facet=False)
    with alt.data_transformers.disable_max_rows():  # Altair refuses > 5,000 rows inline; Streamlit sends Arrow
        spec = chart.to_dict()
        json_mb = len(chart.to_json()) / 1e6
    out = {"spec_s": time.perf_counter() - start}
    start = time.perf_counter()
    sink = io.BytesIO()
    table = pa.Table.from_pandas(points.assign(highlighted=True), preserve_index=False)
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    out["arrow_s"] = time.perf_counter() - start
    out["arrow_mb"] = sink.tell() / 1e6
    out["json_mb"] = json_mb
    if render:
        import vl_convert as vlc

        start = time.perf_counter()
        vlc.vegalite_to_png(spec, scale=1)
        out["render_s"] = time.perf_counter() - start
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50_000, help="images per model (default 50,000)")
    parser.add_argument("--classes", type=int, default=30)
    parser.add_argument("--dim", type=int, default=64, help="feature size for --hits")
    parser.add_argument("--no-render", dest="render", action="store_false")
    parser.add_argument("--hits", action="store_true", help="also time the worker's top-1 search at --n")
    args = parser.parse_args()

    points = synthetic_points(args.n, args.classes)
    start = time.perf_counter()
    shown, note = mx.display_sample(points)
    sample_s = time.perf_counter() - start
    full, small = measure(points, args.render), measure(shown, args.render)
    print(f"{args.n:,} images x 2 models, {args.classes} classes; display sample: {note or 'none'} "
          f"(sampling took {sample_s:.3f} s)")
    print(f"| {'quantity':<28} | {'all points':>12} | {'display sample':>14} | {'ratio':>7} |")
    print(f"|{'-' * 30}|{'-' * 14}|{'-' * 16}|{'-' * 9}|")
    for key, label in (("spec_s", "chart, spec dict + JSON (s)"), ("arrow_s", "Arrow serialise (s)"),
                       ("arrow_mb", "Arrow sent to browser (MB)"), ("json_mb", "inline JSON spec (MB)"),
                       ("render_s", "one render, vl-convert (s)")):
        if key in full:
            print(f"| {label:<28} | {full[key]:>12.3f} | {small[key]:>14.3f} | {full[key] / small[key]:>6.1f}x |")
    if args.hits:
        from engine.analysis.map import top1_hits

        rng = np.random.default_rng(1)
        feats = rng.normal(size=(args.n, args.dim)).astype(np.float32)
        labels = np.arange(args.n) % args.classes
        rows = np.arange(args.n)
        start = time.perf_counter()
        top1_hits(feats[:5000], feats, labels, rows[:5000])
        base = time.perf_counter() - start
        start = time.perf_counter()
        top1_hits(feats, feats, labels, rows)
        whole = time.perf_counter() - start
        print(f"worker top-1 per point, {args.dim}-d: all {args.n:,} queries {whole:.1f} s vs 5,000 queries "
              f"{base:.1f} s ({whole / base:.1f}x)")


if __name__ == "__main__":
    main()
