"""PSP/LSP ``extraction_temperature``: which softmax is stored (paper 000's temperature 12 is a training setting)."""
import math

import numpy as np
import pytest
import torch

from engine.core.config import config_from_dict
from engine.models.extract import extract_outputs, simplex_projection
from engine.methods import build_method
from engine.models import build_model
from engine.run.pipeline import RunContext, run_study
from storage import get_engine, list_model_versions, load_feature_set, session_scope


@pytest.mark.parametrize("name, params, expected", [
    ("psp", {}, 1.0),
    ("psp", {"temperature": 12.0}, 1.0),  # default "none": Eq. 2's plain softmax
    ("psp", {"temperature": 12.0, "extraction_temperature": "training"}, 12.0),
    ("lsp", {"temperature": 0.5, "extraction_temperature": "training"}, 0.5),
    ("independent", {}, 1.0),
])
def test_softmax_temperature(name, params, expected):
    assert build_method(name, **params).softmax_temperature() == expected


@pytest.mark.parametrize("a, b, same", [
    (("independent", {}), ("psp", {"extraction_temperature": "training"}), True),  # temperature 1: the same softmax
    (("psp", {"temperature": 12.0}), ("lsp", {"temperature": 12.0, "extraction_temperature": "training"}), False),
    (("psp", {"temperature": 12.0, "extraction_temperature": "training"}),
     ("lsp", {"temperature": 12.0, "extraction_temperature": "training"}), True),
])
def test_methods_share_stored_outputs_only_at_the_same_softmax_temperature(a, b, same):
    key = lambda m: build_method(m[0], **m[1]).training_key("auto")  # noqa: E731
    assert (key(a) == key(b)) is same


def test_extract_outputs_divides_the_logits_of_the_softmax_only():
    net = build_model(backbone="small_cnn", head="linear", num_classes=3, width=8, seed=0)
    images = torch.rand(4, 3, 16, 16, generator=torch.Generator().manual_seed(0))
    plain = extract_outputs(net, images, device="cpu")
    hot = extract_outputs(net, images, device="cpu", softmax_temperature=12.0)
    np.testing.assert_array_equal(hot["logits"], plain["logits"])
    z = plain["logits"].astype(np.float64)[0]
    by_hand = [math.exp(v / 12) for v in z]
    np.testing.assert_allclose(hot["softmax"][0], [v / sum(by_hand) for v in by_hand], rtol=1e-5)
    for bad in (0, -1.0, float("inf"), True, "12"):
        with pytest.raises(ValueError, match="softmax_temperature must be a positive finite number"):
            extract_outputs(net, images, device="cpu", softmax_temperature=bad)


def test_lsp_is_unchanged_by_any_scale_of_the_logits():
    z = torch.tensor([[2.0, -1.0, 0.5, 4.0]])
    # centred [1.5, -1.5, 0] over the first 3 logits, so [1, -1, 0] / sqrt(2) at any positive scale
    expected = torch.tensor([[1.0, -1.0, 0.0]]) / math.sqrt(2)
    for scale in (1.0, 1 / 12):
        torch.testing.assert_close(simplex_projection(z * scale, 3), expected)


def test_a_study_stores_the_softmax_at_the_training_temperature(tmp_path):
    cfg = config_from_dict({
        "dataset": {"name": "digits"}, "methods": ["psp"],
        "method_params": {"psp": {"temperature": 12.0, "extraction_temperature": "training"}},
        "scenario": {"initial_classes": 5, "increment": 5, "num_steps": 2},
        "model": {"backbone": "small_cnn", "width": 8}, "training": {"epochs": 1, "batch_size": 64, "lr": 0.05}})
    ctx = RunContext(get_engine(f"sqlite:///{tmp_path / 'db.sqlite'}"), tmp_path / "ckpt")
    _, (exp_id,) = run_study(cfg, ctx)
    with session_scope(ctx.db) as s:
        for v in list_model_versions(s, exp_id):
            logits = load_feature_set(s, v.id, "query", "logits")[0].astype(np.float64)
            softmax = load_feature_set(s, v.id, "query", "softmax")[0]
            e = np.exp(logits / 12 - (logits / 12).max(axis=1, keepdims=True))
            np.testing.assert_allclose(softmax, e / e.sum(axis=1, keepdims=True), rtol=1e-4, atol=1e-7)


def test_a_bad_extraction_temperature_is_refused_by_the_config_and_the_method():
    with pytest.raises(ValueError, match="method_params.psp.extraction_temperature must be one of \\('none', 'training'\\), got 12"):
        config_from_dict({"dataset": {"name": "digits"}, "methods": ["psp"],
                          "method_params": {"psp": {"extraction_temperature": 12}}})
    with pytest.raises(ValueError, match="psp: extraction_temperature must be one of \\('none', 'training'\\)"):
        build_method("psp", extraction_temperature=12)
