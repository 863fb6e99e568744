"""The doctor's statistics on real embeddings (issue 42 item 4): MiniLM L3 and L6 (both 384-d) on WordNet definitions,
each store alone (clean) and mixed at several shares (the first items under L6, the rest under L3, as an index half
re-embedded would hold them), with L3's raw norms and with every row unit-length (the neighbour test alone).

Prints per store the norm test's BIC(1) - BIC(2) and Ashman's D, the neighbour test's cross-edge share and minor
share, and the verdict, against the thresholds of ``engine/metrics/mixture.py``. Embeddings are cached in OUT.

    OMP_NUM_THREADS=1 python bench/doctor_minilm.py --out /tmp/doctor [--gallery 3000]
"""
from __future__ import annotations

import argparse
import runpy
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="scratch folder (created; the embeddings are reused)")
    p.add_argument("--gallery", type=int, default=3000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    import pyarrow as pa
    import pyarrow.parquet as pq

    from engine.analysis.doctor import diagnose
    from engine.data import roots
    from engine.metrics.mixture import CROSS_SHARE, DELTA_BIC, SEPARATION
    from engine.sources import open_source

    args.out.mkdir(parents=True, exist_ok=True)
    roots.export(argparse.Namespace(data_roots=[str(args.out.resolve())]))
    embed_wordnet = runpy.run_path(str(ROOT / "bench" / "bench_remedies.py"))["embed_wordnet"]  # its cached npz files
    embed_wordnet(args.out, queries=10, gallery=args.gallery, seed=args.seed)
    old = np.load(args.out / "text_gallery_old.npz")["vectors"]
    new = np.load(args.out / "text_gallery_new.npz")["vectors"]
    n = len(new)
    unit = old / np.linalg.norm(old, axis=1, keepdims=True)
    stores = {"L3 alone": old, "L6 alone": new}
    for share in (0.5, 0.7, 0.9):
        k = int(round(share * n))
        stores[f"{share:.0%} L6 + L3 raw"] = np.vstack([new[:k], old[k:]])
        stores[f"{share:.0%} L6 + L3 unit"] = np.vstack([new[:k], unit[k:]])
    print(f"thresholds: BIC(1) - BIC(2) > {DELTA_BIC:g} and D >= {SEPARATION:g}; cross-edge share <= {CROSS_SHARE:g}")
    print(f"{'store':<20} {'dBIC':>9} {'D':>6} {'norms':>9} {'cross':>7} {'minor':>6} {'neighbours':>10} verdict")
    for name, x in stores.items():
        path = args.out / "store.parquet"
        pq.write_table(pa.table({"id": np.arange(len(x)), "vector": pa.FixedSizeListArray.from_arrays(
            pa.array(x.astype(np.float32).reshape(-1)), x.shape[1])}), path)
        source = open_source(str(path), what="the store")
        r = diagnose(source, seed=args.seed)
        source.close()
        nt, st = r["tests"]["norms"], r["tests"]["neighbours"]
        cross = "-" if st["cross_edge_share"] is None else f"{st['cross_edge_share']:.3f}"
        print(f"{name:<20} {nt['delta_bic']:>9.1f} {nt['separation']:>6.2f} {nt['verdict']:>9} {cross:>7} "
              f"{st['minor_share']:>6.3f} {st['verdict']:>10} {r['verdict']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
