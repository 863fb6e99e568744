"""A post-hoc map as an ONNX graph (built with the ``onnx`` package's helper, no torch.onnx), so any runtime applies it.

Input ``new`` (batch, new_dim) float32, output ``old`` (batch, old_dim) float32; the weights are initializers.
Operators: MatMul, Add, Relu, Mul, Div, Max, Sqrt, ReduceSumSquare / ReduceSum (the L2 normalisation
``x / max(||x||, 1e-12)``), and for the per-cluster map Softmax or ArgMax + OneHot (hard routing) and Reshape.
Opset :data:`OPSET`; ``onnx`` is an optional dependency (``requirements-onnx.txt``), imported when a graph is built.
"""
from __future__ import annotations

import numpy as np

from engine.adapters.posthoc import EPS, PosthocMap

OPSET = 17
INPUT, OUTPUT = "new", "old"


class _Graph:
    """Nodes and initializers of one graph under construction, with fresh names."""

    def __init__(self) -> None:
        from onnx import helper, numpy_helper

        self.helper, self.numpy_helper = helper, numpy_helper
        self.nodes: list = []
        self.inits: list = []
        self.count = 0

    def const(self, name: str, value: np.ndarray) -> str:
        self.inits.append(self.numpy_helper.from_array(np.ascontiguousarray(value), name=name))
        return name

    def op(self, op_type: str, *inputs: str, out: str | None = None, **attrs) -> str:
        self.count += 1
        name = out or f"{op_type.lower()}_{self.count}"
        self.nodes.append(self.helper.make_node(op_type, list(inputs), [name], name=f"n{self.count}_{op_type}", **attrs))
        return name

    def l2(self, x: str, out: str | None = None) -> str:
        """``x / max(sqrt(sum(x^2, axis=-1)), EPS)``."""
        norm = self.op("Sqrt", self.op("ReduceSumSquare", x, axes=[-1], keepdims=1))
        eps = self.const(f"eps_{self.count}", np.array(EPS, np.float32))
        return self.op("Div", x, self.op("Max", norm, eps), out=out)


def _procrustes(g: _Graph, x: str, m: PosthocMap) -> str:
    return g.op("MatMul", x, g.const("weight", m.tensors["weight"]))


def _affine(g: _Graph, x: str, m: PosthocMap) -> str:
    return g.op("Add", g.op("MatMul", x, g.const("weight", m.tensors["weight"])), g.const("bias", m.tensors["bias"]))


def _cluster(g: _Graph, x: str, m: PosthocMap) -> str:
    k, do = m.tensors["centroids"].shape
    routed = g.op("MatMul", x, g.const("route", m.tensors["route"]))
    scores = g.op("MatMul", routed, g.const("centroids_t", np.ascontiguousarray(m.tensors["centroids"].T)))
    if m.options.routing == "hard":
        best = g.op("ArgMax", scores, axis=1, keepdims=0)
        depth = g.const("k", np.array(k, np.int64))
        values = g.const("onehot_values", np.array([0, 1], np.float32))
        weights = g.op("OneHot", best, depth, values, axis=-1)
    else:
        scaled = g.op("Div", scores, g.const("temperature", np.array(m.options.temperature, np.float32)))
        weights = g.op("Softmax", scaled, axis=-1)
    mapped = g.op("MatMul", x, g.const("stack", m.tensors["stack"]))
    cube = g.op("Reshape", mapped, g.const("cube_shape", np.array([-1, k, do], np.int64)))
    w3 = g.op("Reshape", weights, g.const("weight_shape", np.array([-1, k, 1], np.int64)))
    return g.op("ReduceSum", g.op("Mul", cube, w3), g.const("axis_1", np.array([1], np.int64)), keepdims=0)


def _mlp(g: _Graph, x: str, m: PosthocMap) -> str:
    t = m.tensors
    hidden = g.op("Relu", g.op("Add", g.op("MatMul", x, g.const("down", t["down"])), g.const("down_bias", t["down_bias"])))
    residual = g.op("MatMul", hidden, g.const("up", t["up"]))
    base = g.op("MatMul", x, g.const("base", t["base"]))
    return g.op("Add", g.op("Add", base, residual), g.const("bias", t["bias"]))


BUILDERS = {"procrustes": _procrustes, "affine": _affine, "cluster": _cluster, "mlp": _mlp}


def onnx_model(m: PosthocMap):
    """The ``onnx.ModelProto`` of ``m`` (checked by ``onnx.checker``)."""
    try:
        import onnx
    except ImportError:
        raise ValueError("exporting an ONNX graph needs the onnx package: pip install -e .[onnx] "
                         "(requirements-onnx.txt)") from None
    g = _Graph()
    x = g.l2(INPUT) if m.normalise == "l2" else INPUT
    y = BUILDERS[m.kind](g, x, m)
    if m.normalise == "l2":
        g.l2(y, out=OUTPUT)
    else:
        g.op("Identity", y, out=OUTPUT)
    h = g.helper
    graph = h.make_graph(g.nodes, f"compatlab_{m.kind}_adapter",
                         [h.make_tensor_value_info(INPUT, onnx.TensorProto.FLOAT, ["batch", m.new_dim])],
                         [h.make_tensor_value_info(OUTPUT, onnx.TensorProto.FLOAT, ["batch", m.old_dim])], g.inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", OPSET)], producer_name="compatlab")
    model.ir_version = 8  # opset 17's IR version: runtimes from 2022 on read it
    onnx.checker.check_model(model)
    return model


__all__ = ["BUILDERS", "INPUT", "OPSET", "OUTPUT", "onnx_model"]
