"""The explorer's side of the feature map: what to show, what a click or a box picks, which classes match.

Pure pandas functions over the map's sample points (columns ``x, y, model, class, label, row`` and, for
maps computed since they were stored, ``hit`` and ``drift``, -1 where not defined); no Streamlit, no database, no torch.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

DISPLAY_LIMIT = 5000  # sample points per model drawn at most (bench/bench_map.py: size and time vs 50,000)
# colour-by options: label -> the column of the points it colours by (derived by ``with_colour_columns``)
COLOUR_BY = {"class": "class", "model": "model", "retrieved across models": "retrieval", "drift magnitude": "drift"}
RETRIEVAL_ORDER = ("both correct", "lost by the update", "gained by the update", "both wrong")
PICK, BOX = "pick", "box"  # names of the map's click and box selections (app.charts.projection_chart)
ImageUris = Callable[[pd.DataFrame], Sequence[str | None]]  # rows of the map -> image URIs (thumbnails), or None


def has_explorer_columns(points: pd.DataFrame) -> bool:
    """Whether the stored map carries the per-point hit and drift (maps stored before them do not)."""
    return {"hit", "drift"} <= set(points.columns) and bool((points["hit"] >= 0).any())


def with_colour_columns(points: pd.DataFrame, model_names: Sequence[str]) -> pd.DataFrame:
    """``points`` plus ``retrieval``: per image, its top-1 retrieval by the old model (old/old) and by the new
    query in the old gallery (new/old), as one of :data:`RETRIEVAL_ORDER` shared by both of its points."""
    out = points.copy()
    if "drift" in out:
        out["drift"] = out["drift"].where(out["drift"] >= 0)  # -1 = not defined
    if not has_explorer_columns(points):
        out["retrieval"] = "not stored"
        return out
    hit = points.pivot_table(index="row", columns="model", values="hit", aggfunc="first")
    old = hit.get(model_names[0], pd.Series(np.nan, index=hit.index))
    new = hit.get(model_names[1], pd.Series(np.nan, index=hit.index))
    label = np.select([(old == 1) & (new == 1), (old == 1) & (new == 0), (old == 0) & (new == 1),
                       (old == 0) & (new == 0)], list(RETRIEVAL_ORDER), default="not stored")
    out["retrieval"] = out["row"].map(pd.Series(label, index=hit.index))
    return out


def display_sample(points: pd.DataFrame, limit: int = DISPLAY_LIMIT, seed: int = 0) -> tuple[pd.DataFrame, str]:
    """At most ``limit`` images per model, the same images for every model, sampled per class in proportion
    (largest remainders; every class keeps at least one image); returns the points and a note ('' when nothing
    was dropped)."""
    images = points.drop_duplicates("row")[["row", "class"]]
    if len(images) <= limit:
        return points, ""
    groups = [group["row"].to_numpy() for _, group in images.groupby("class", sort=True)]
    quota = np.array([len(g) for g in groups]) * (limit / len(images))
    sizes = np.floor(quota).astype(int)
    sizes[np.argsort(sizes - quota)[: limit - sizes.sum()]] += 1  # largest remainders: exactly ``limit`` in all
    rng = np.random.default_rng(seed)
    keep = [rng.choice(g, size=max(1, n), replace=False) for g, n in zip(groups, sizes)]
    rows = np.concatenate(keep)
    shown = points[points["row"].isin(rows)]
    note = (f"showing {len(rows):,} of {len(images):,} points per model, sampled per class (seed {seed}); "
            "box selection and search cover all stored points")
    return shown, note


def matching_classes(classes: Sequence[str], text: str) -> list[str]:
    """Classes whose name contains ``text`` (case-insensitive; blank text matches none), in the given order."""
    needle = text.strip().casefold()
    return [c for c in classes if needle and needle in str(c).casefold()]


def matching_rows(texts: Sequence[str], text: str) -> list[int]:
    """Rows whose text contains ``text`` (case-insensitive; blank text matches none), in row order."""
    needle = text.strip().casefold()
    return [row for row, t in enumerate(texts) if needle and needle in str(t).casefold()]


def short(text: str, limit: int = 120) -> str:
    """``text`` on one line, cut to ``limit`` characters with an ellipsis."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 1].rstrip() + "…"


def clicked_row(event: Mapping[str, Any] | None) -> int | None:
    """The stored row of the point a map click selected (Streamlit's selection state), or None."""
    picked = ((event or {}).get("selection") or {}).get(PICK) or []
    rows = [p.get("row") for p in picked if isinstance(p, Mapping) and p.get("row") is not None]
    return int(rows[-1]) if rows else None


def boxed_points(event: Mapping[str, Any] | None, points: pd.DataFrame) -> pd.DataFrame:
    """The points (all stored ones, not only those drawn) inside the map's box selection; empty without one."""
    box = ((event or {}).get("selection") or {}).get(BOX) or {}
    if "x" not in box or "y" not in box:
        return points.iloc[:0]
    (x0, x1), (y0, y1) = sorted(box["x"]), sorted(box["y"])
    return points[points["x"].between(x0, x1) & points["y"].between(y0, y1)]


def selection_table(selected: pd.DataFrame, image_uris: ImageUris | None = None,
                    texts: Sequence[str] | None = None) -> pd.DataFrame:
    """One line per selected point: class, model, stored row (and ``image`` when ``image_uris`` is given, ``text``,
    the row's text, when ``texts``, one per stored row, are)."""
    columns = [c for c in ("class", "model", "row", "retrieval", "drift") if c in selected]
    table = selected.sort_values(["row", "model"])[columns].reset_index(drop=True)
    if image_uris is not None:
        table.insert(0, "image", list(image_uris(table)))
    if texts is not None:
        table.insert(0, "text", [str(texts[r]) for r in table["row"]])
    return table
