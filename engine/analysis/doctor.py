"""Does one store hold vectors of more than one model? (``python -m engine doctor SRC``, issue 42 item 4).

One streamed pass over the source (a block held at a time) counts every item's trailing zeros (the dimension test,
exact over the whole store) and keeps a uniform reservoir sample of ``sample`` items; the norm and neighbour tests of
:mod:`engine.metrics.mixture` read the sample, and the fingerprints the store's files carry are compared (exact, per
file). Each test gives its verdict (``mixed``, ``clean`` or ``undecided``), its statistic against its threshold and its
groups' counts (for the sampled tests, the sample's counts and the store's estimated from their shares); the store is
mixed when any test says so.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from engine.metrics import mixture
from engine.sources import Source, SourceError

DEFAULT_SAMPLE, MAX_SAMPLE = 2000, 10_000  # the neighbour test holds a sample x sample float32 graph (10,000: 400 MB)


def _reservoir(source: Source, sample: int, rng: np.random.Generator, block_rows: int) -> dict[str, Any]:
    """Stream ``source``: every row's trailing zeros counted, ``sample`` rows kept uniformly (algorithm R)."""
    kept = None
    seen, padded, zero, tails_max = 0, 0, 0, None
    for block in source.blocks(block_rows):
        x = block.vectors
        d = x.shape[1]
        if kept is None:
            kept = np.empty((min(sample, source.count or sample), d), np.float32)
        tails = mixture.zero_tails(x)
        is_zero = tails == d
        is_padded = (tails >= mixture.min_tail(d)) & ~is_zero
        zero += int(is_zero.sum())
        padded += int(is_padded.sum())
        if is_padded.any():
            longest = int(d - tails[is_padded].min())
            tails_max = longest if tails_max is None else max(tails_max, longest)
        m = len(kept)
        fill = max(0, min(m - seen, len(x)))
        kept[seen:seen + fill] = x[:fill]
        t = np.arange(seen + fill, seen + len(x))
        slots = rng.integers(0, t + 1) if len(t) else t  # algorithm R: row t replaces slot j when j < m
        for i in np.flatnonzero(slots < m):  # in order, as the sequential algorithm does
            kept[slots[i]] = x[fill + i]
        seen += len(x)
    if kept is None:
        kept = np.zeros((0, source.dim or 1), np.float32)
    return {"items": seen, "sample": kept[:min(seen, len(kept))], "padded": padded, "zero": zero,
            "padded_width": tails_max}


def _estimated(groups: np.ndarray, items: int) -> list[dict[str, Any]]:
    shares = [1 - float(groups.mean()), float(groups.mean())] if len(groups) else [1.0, 0.0]
    return [{"sample_items": int((groups == g).sum()), "share": s, "items_estimated": int(round(s * items))}
            for g, s in enumerate(shares)]


def _fingerprints(source: Source) -> dict[str, Any]:
    parts = source.fingerprint_parts
    if not parts or all(fp is None for _, _, fp in parts):
        return {"verdict": "undecided", "statistic": "no fingerprint in the store's metadata", "groups": []}
    found: dict[str, dict[str, Any]] = {}
    for name, rows, fp in parts:
        key = "none" if fp is None else fp.describe()  # "none": no fingerprint
        entry = found.setdefault(key, {"fingerprint": None if fp is None else fp.to_json(), "model": key, "items": 0,
                                       "parts": 0})
        entry["parts"] += 1
        entry["items"] = None if rows is None or entry["items"] is None else entry["items"] + rows
    groups = list(found.values())
    distinct = sum(g["fingerprint"] is not None for g in groups)  # a file without one is unknown, not another model
    return {"verdict": "mixed" if distinct > 1 else "clean", "groups": groups,
            "statistic": f"{distinct} distinct fingerprint(s) over {len(parts)} file(s) or table(s)"
                         + (f", {found['none']['parts']} without one" if "none" in found else "")}


def diagnose(source: Source, *, sample: int = DEFAULT_SAMPLE, seed: int = 0, block_rows: int = 65536) -> dict[str, Any]:
    """The doctor's report on ``source`` (module docstring); ``report["verdict"]`` is ``mixed`` or ``clean``."""
    if not 20 <= sample <= MAX_SAMPLE:
        raise ValueError(f"--sample must lie in [20, {MAX_SAMPLE}], got {sample}")
    tests: dict[str, Any] = {"fingerprints": _fingerprints(source)}
    try:
        seen = _reservoir(source, sample, np.random.default_rng(seed), block_rows)
    except SourceError as exc:
        if "(ragged)" not in str(exc):
            raise
        tests["dimension"] = {"verdict": "mixed", "statistic": f"vectors of several widths: {exc}", "groups": []}
        return {"source": source.description, "items": source.count, "dim": None, "sample": 0, "tests": tests,
                "verdict": "mixed"}
    items, x = seen["items"], seen["sample"]
    d = int(x.shape[1])
    full = items - seen["padded"] - seen["zero"]
    tests["dimension"] = {
        "verdict": "mixed" if seen["padded"] else "clean",
        "statistic": f"{seen['padded']} items end in at least {mixture.min_tail(d)} zero coordinates of {d}",
        "threshold": f"any item with a zero tail of at least {mixture.min_tail(d)} coordinates (max(8, d/4))",
        "groups": [{"dims": d, "items": full}]
        + ([{"dims": seen["padded_width"], "items": seen["padded"], "note": "zero-padded to the store's width"}]
           if seen["padded"] else []),
        "zero_vectors": seen["zero"]}
    norms = mixture.norm_mixture(np.linalg.norm(x.astype(np.float64), axis=1), seed=seed)
    tests["norms"] = {"verdict": norms.verdict, **norms.stats,
                      "threshold": f"BIC(1) - BIC(2) > {mixture.DELTA_BIC:g}, Ashman's D >= {mixture.SEPARATION:g}, "
                                   f"minor share >= {mixture.MIN_SHARE:g}",
                      "groups": _estimated(norms.groups, items) if norms.verdict == "mixed" else []}
    if norms.verdict == "mixed":
        for g, entry in enumerate(tests["norms"]["groups"]):
            sel = x[norms.groups == g]
            entry["median_norm"] = float(np.median(np.linalg.norm(sel, axis=1))) if len(sel) else None
    space = mixture.space_split(x[np.any(x != 0, axis=1)], seed=seed)
    tests["neighbours"] = {"verdict": space.verdict, **space.stats,
                           "threshold": f"cross-edge share <= {mixture.CROSS_SHARE:g} with a minor share >= "
                                        f"{mixture.MIN_SHARE:g}; undecided below edge density {mixture.MIN_DENSITY:g} "
                                        f"(edges: |cos| > {mixture.Z_EDGE:g}/sqrt(d))",
                           "groups": _estimated(space.groups, items) if space.verdict == "mixed" else []}
    verdict = "mixed" if any(t["verdict"] == "mixed" for t in tests.values()) else "clean"
    return {"source": source.description, "items": items, "dim": d, "sample": int(len(x)), "seed": seed,
            "tests": tests, "verdict": verdict}


def format_report(report: dict[str, Any]) -> str:
    """The report as the command prints it: one line per test, then one per group."""
    lines = [f"{report['source']}: {report['items']} items, {report['dim']}-d, {report['sample']} sampled"]
    for name in ("dimension", "norms", "neighbours", "fingerprints"):
        t = report["tests"].get(name)
        if t is None:
            continue
        if name == "norms" and t["verdict"] == "undecided":
            stat = (f"every vector has about the same norm (log-norm spread {t['log_norm_std']:.2g}): nothing to "
                    "read (the neighbour test still reads the directions)")
        elif name == "neighbours" and t["verdict"] == "undecided":
            stat = (f"too few pairs beyond chance (edge density {t['density']:.3g} < {mixture.MIN_DENSITY:g}): no "
                    "structure to split")
        elif name == "norms" and "delta_bic" in t:
            stat = (f"BIC(1) - BIC(2) = {t['delta_bic']:.1f}, Ashman's D = {t['separation']:.2f}, minor share "
                    f"{t['minor_share']:.3f} ({t['threshold']})")
        elif name == "neighbours" and "cross_edge_share" in t:
            stat = (f"cross-edge share {t['cross_edge_share']:.4f}, edge density {t['density']:.3f}, minor share "
                    f"{t['minor_share']:.3f} ({t['threshold']})")
        else:
            stat = t["statistic"]
        lines.append(f"  {name}: {t['verdict']}: {stat}")
        for g in t.get("groups", []):
            if "items_estimated" in g:
                lines.append(f"    group: {g['sample_items']} of the sample ({100 * g['share']:.1f}%), about "
                             f"{g['items_estimated']} items")
            elif "dims" in g:
                lines.append(f"    group: {g['items']} items of {g['dims']} dims" + (f" ({g['note']})" if "note" in g
                                                                                     else ""))
            else:
                lines.append(f"    group: {g['model']}: {g['items'] if g['items'] is not None else '?'} items in "
                             f"{g['parts']} part(s)")
    lines.append(f"verdict: {report['verdict']}" + (" (more than one model's vectors)" if report["verdict"] == "mixed"
                                                     else " (one model's vectors, as far as these tests see)"))
    return "\n".join(lines)


__all__ = ["DEFAULT_SAMPLE", "MAX_SAMPLE", "diagnose", "format_report"]
