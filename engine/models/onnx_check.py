"""A user's ONNX graph checked before onnxruntime loads it (issue 39, "models that are not data").

onnxruntime is handed the graph's bytes, so it reads no external file, but it would still accept, or fail on with its
own internal message, a graph that is not an encoder's data. :func:`check_graph` parses it with ``onnx`` (never
loading external data) and refuses, in one line: an operator domain other than the standard one (a custom-op
library), local functions, control flow (``Loop``, ``Scan``, ``If``: a text encoder needs none, and a loop of 10^15
iterations is a hang), an initialiser or constant whose data lives outside the graph (external data: ``/etc/passwd``,
``../..``, a file beside it) or whose bytes differ from its declared shape (dims of 10^6 x 10^6 with 4 bytes),
and an operator that would allocate from a constant shape beyond :data:`MAX_ELEMENTS` (``ConstantOfShape`` of 10^10
floats, an ``Expand`` or ``Tile`` of the same).
"""
from __future__ import annotations

import math

import numpy as np

STANDARD_DOMAINS = ("", "ai.onnx")
CONTROL_FLOW = ("Loop", "Scan", "If")
SHAPED = {"ConstantOfShape": 0, "Expand": 1, "Tile": 1}  # op -> the input holding a shape (Tile: repeats)
MAX_ELEMENTS = 100_000_000  # a tensor built from a constant shape: 400 MB of float32


class GraphError(ValueError):
    """A graph refused before onnxruntime loads it; one line."""


def _tensor_bytes(t, what: str) -> None:
    """A tensor's data must live in the graph and be the size its dims and type declare."""
    from onnx import TensorProto, helper

    if t.data_location == TensorProto.EXTERNAL or len(t.external_data):
        raise GraphError(f"{what} {t.name!r} keeps its data in an external file; a graph must carry its own data")
    count = math.prod(int(d) for d in t.dims)
    if any(int(d) < 0 for d in t.dims):
        raise GraphError(f"{what} {t.name!r} has a negative dimension {list(t.dims)}")
    if t.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        return
    if t.raw_data:
        dtype = helper.tensor_dtype_to_np_dtype(t.data_type)
        if len(t.raw_data) != count * np.dtype(dtype).itemsize:
            raise GraphError(f"{what} {t.name!r} declares {list(t.dims)} of {np.dtype(dtype)} ({count:,} values) but "
                             f"carries {len(t.raw_data):,} bytes")
        return
    field = helper.tensor_dtype_to_field(t.data_type)
    held = len(getattr(t, field))
    per = 2 if t.data_type in (TensorProto.COMPLEX64, TensorProto.COMPLEX128) else 1
    if held != count * per and not (count == 0 and held == 0):
        raise GraphError(f"{what} {t.name!r} declares {list(t.dims)} ({count:,} values) but carries {held:,}")


def _constant_values(graph) -> dict[str, np.ndarray]:
    """The graph's constants by name (initialisers and Constant nodes' value tensors), small ones only."""
    from onnx import numpy_helper

    out = {}
    tensors = list(graph.initializer) + [a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute
                                         if a.name == "value"]
    names = [t.name for t in graph.initializer] + [n.output[0] for n in graph.node if n.op_type == "Constant"
                                                   for a in n.attribute if a.name == "value"]
    for name, t in zip(names, tensors):
        if math.prod(int(d) for d in t.dims) <= 64:  # shapes are short vectors
            out[name] = numpy_helper.to_array(t)
    return out


def check_graph(model: bytes, name: str) -> None:
    """Refuse a graph that is not an encoder's data (see the module docstring); ``GraphError`` in one line."""
    import onnx

    try:
        proto = onnx.ModelProto.FromString(model)  # the bytes only: external data is never loaded
    except Exception as exc:  # noqa: BLE001 - not a protobuf of a model
        raise GraphError(f"{name} is not an ONNX model ({str(exc).splitlines()[0][:120]})") from None
    graph = proto.graph
    for t in graph.initializer:  # first: a graph naming a file outside is refused as such
        _tensor_bytes(t, f"{name}: initialiser")
    other = sorted({o.domain for o in proto.opset_import if o.domain not in STANDARD_DOMAINS})
    if other:
        raise GraphError(f"{name} imports operator domain(s) {', '.join(other)}; only the standard ONNX operators run "
                         "here (no custom-op library)")
    if len(proto.functions):
        raise GraphError(f"{name} defines {len(proto.functions)} local function(s); a text encoder's graph needs none")
    constants = _constant_values(graph)
    for node in graph.node:
        if node.domain not in STANDARD_DOMAINS:
            raise GraphError(f"{name}: operator {node.op_type} of domain {node.domain!r} is not a standard one")
        if node.op_type in CONTROL_FLOW:
            raise GraphError(f"{name}: operator {node.op_type} (control flow) is not run here; a text encoder needs none")
        for a in node.attribute:
            if a.HasField("t"):
                _tensor_bytes(a.t, f"{name}: constant of {node.op_type}")
            if a.g.node or len(a.graphs):
                raise GraphError(f"{name}: operator {node.op_type} carries a subgraph; not run here")
        at = SHAPED.get(node.op_type)
        if at is not None and len(node.input) > at and node.input[at] in constants:
            shape = constants[node.input[at]].astype(np.float64)
            if shape.size and np.prod(np.abs(shape)) > MAX_ELEMENTS:
                raise GraphError(f"{name}: {node.op_type} builds a tensor of {int(np.prod(np.abs(shape))):,} values from "
                                 f"a constant shape, more than {MAX_ELEMENTS:,}")
