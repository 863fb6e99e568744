"""Shared by several test modules; moved from tests/test_map_explore.py."""
from __future__ import annotations

import json

import pandas as pd
import pyarrow as pa

from app import map_explore as mx


def map_layer(spec: dict) -> dict:
    """The layer of the map's sample points (the view Altair names in the click selection's ``views``)."""
    layers = spec.get("layer") or [layer for view in spec.get("hconcat", []) for layer in view["layer"]]
    pick = next(p for p in spec["params"] if p["name"] == mx.PICK)
    return next(layer for layer in layers if layer.get("name") in pick["views"])


def drawn(at) -> tuple[dict, pd.DataFrame]:
    """The map's Vega-Lite spec and its sample points, as the page sent them."""
    chart = at.get("vega_lite_chart")[0].proto
    spec = json.loads(chart.spec)
    layer = map_layer(spec)
    datasets = {d.name: d.data.data for d in chart.datasets}
    name = layer["data"]["name"]
    frame = pa.ipc.open_stream(datasets[name]).read_all().to_pandas()
    return spec, frame

