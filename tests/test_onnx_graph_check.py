"""A user's ONNX graph is checked before onnxruntime loads it (issue 39, "models that are not data", "hangs"): external
data anywhere, custom domains, loops, initialisers that lie about their size, allocations from constant shapes."""
from __future__ import annotations

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="pip install -r requirements-text.txt")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from engine.models.onnx_check import MAX_ELEMENTS, GraphError, check_graph  # noqa: E402


def model(nodes, initializers=(), opsets=(("", 17),)) -> bytes:
    g = helper.make_graph(list(nodes), "g", [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(initializers))
    return helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets]).SerializeToString()


def refused(data: bytes, message: str) -> None:
    with pytest.raises(GraphError, match=message) as exc:
        check_graph(data, "m.onnx")
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("location", ["/etc/passwd", "../../../etc/passwd", "w.bin"])
def test_external_data_anywhere_is_refused(location):
    w = numpy_helper.from_array(np.ones(4, np.float32), "w")
    w.data_location = TensorProto.EXTERNAL
    w.ClearField("raw_data")
    w.external_data.add(key="location", value=location)
    refused(model([helper.make_node("Identity", ["w"], ["y"])], [w]), "keeps its data in an external file")


def test_custom_domains_functions_and_loops_are_refused():
    refused(model([helper.make_node("Steal", ["input_ids"], ["y"], domain="com.example")],
                  opsets=(("", 17), ("com.example", 1))), r"imports operator domain\(s\) com.example")
    body = helper.make_graph([], "body", [], [])
    loop = helper.make_node("Loop", ["n", "c"], ["y"], body=body)
    n = numpy_helper.from_array(np.array(10 ** 15, np.int64), "n")
    c = numpy_helper.from_array(np.array(True), "c")
    refused(model([loop], [n, c]), r"operator Loop \(control flow\) is not run here")


def test_an_initialiser_that_lies_about_its_size_is_refused():
    w = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[10 ** 6, 10 ** 6], raw_data=b"\0\0\0\0")
    refused(model([helper.make_node("Identity", ["w"], ["y"])], [w]),
            r"declares \[1000000, 1000000\] of float32 \(1,000,000,000,000 values\) but carries 4 bytes")


def test_a_constant_of_shape_beyond_the_bound_is_refused_and_a_small_one_passes():
    shape = numpy_helper.from_array(np.array([10 ** 5, 10 ** 5], np.int64), "shape")
    refused(model([helper.make_node("ConstantOfShape", ["shape"], ["y"])], [shape]),
            f"ConstantOfShape builds a tensor of 10,000,000,000 values from a constant shape, more than {MAX_ELEMENTS:,}")
    small = numpy_helper.from_array(np.array([2, 3], np.int64), "shape")
    check_graph(model([helper.make_node("ConstantOfShape", ["shape"], ["y"])], [small]), "m.onnx")


def test_the_shipped_minilm_graphs_pass():
    from engine.data.text_model_files import MINILM_L3_ONNX, installed_path

    try:
        path = installed_path(MINILM_L3_ONNX)
    except Exception as exc:  # noqa: BLE001 - the model wheels are an optional extra
        pytest.skip(f"MiniLM L3 not installed: {exc}")
    check_graph(path.read_bytes(), path.name)
