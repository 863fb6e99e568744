"""The full network, its factory, frozen copies and safetensors checkpoints."""
import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from engine.models import ModelOutput, Net, build_model, load_checkpoint, read_checkpoint_meta, save_checkpoint
from engine.models.heads import dsimplex_prototypes


def small(head: str, num_classes: int, **kwargs) -> Net:
    return build_model(backbone="small_cnn", head=head, num_classes=num_classes, in_channels=1, width=16, **kwargs)


def digits(n: int = 3) -> torch.Tensor:
    return torch.randn(n, 1, 8, 8, generator=torch.Generator().manual_seed(0))


def test_forward_returns_features_and_logits():
    net = small("linear", 4)
    out = net(digits())
    assert isinstance(out, ModelOutput)
    assert out.features.shape == (3, 16) and out.logits.shape == (3, 4)
    assert net.projection is None and net.feature_dim == 16


def test_dsimplex_net_projects_to_k_minus_1_features():
    net = small("dsimplex", 10)
    assert net.feature_dim == 9 and net.projection is not None
    out = net(digits())
    assert out.features.shape == (3, 9)
    torch.testing.assert_close(out.logits, out.features @ dsimplex_prototypes(10).T)
    with pytest.raises(ValueError, match="K-1=9"):
        small("dsimplex", 10, feature_dim=16)


def test_feature_dim_adds_projection_and_etf_checks_size():
    assert small("linear", 4, feature_dim=8).feature_dim == 8
    with pytest.raises(ValueError, match="feature_dim >= 19"):
        small("etf", 20)
    assert small("etf", 20, feature_dim=19).feature_dim == 19


def test_option_validation():
    with pytest.raises(ValueError, match="known heads"):
        small("cosine", 4)
    with pytest.raises(ValueError, match="fixed heads only"):
        small("linear", 4, label_allocation="right_to_left")
    with pytest.raises(ValueError, match="linear head only"):
        small("dsimplex", 4, linear_bias=True)


def test_seed_controls_initialisation_without_touching_global_rng():
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a, b, c = small("linear", 4, seed=1), small("linear", 4, seed=1), small("linear", 4, seed=2)
    assert torch.equal(torch.rand(1), expected_next)
    weights = [next(n.backbone.parameters()) for n in (a, b, c)]
    assert torch.equal(weights[0], weights[1]) and not torch.equal(weights[0], weights[2])


def test_frozen_copy_is_independent_and_untrainable():
    net = small("linear", 4)
    old = net.frozen_copy()
    assert not old.training and all(not p.requires_grad for p in old.parameters())
    assert net.training and all(p.requires_grad for p in net.parameters())
    with torch.no_grad():
        next(net.parameters()).add_(1.0)
    assert not torch.equal(next(net.parameters()), next(old.parameters()))


def test_spec_follows_head_expansion():
    net = small("linear", 4)
    net.head.expand(3, seed=0)
    assert net.spec.num_classes == 7


@pytest.mark.parametrize(
    "options",
    [
        {"head": "linear", "num_classes": 4, "linear_bias": True},
        {"head": "dsimplex", "num_classes": 6, "label_allocation": "right_to_left", "dsimplex_normalization": "frobenius"},
        {"head": "etf", "num_classes": 5, "feature_dim": 8, "seed": 7},
        {"head": "etf", "num_classes": 5, "feature_dim": 8, "seed": 7, "frame_seed": 3},
    ],
)
def test_checkpoint_round_trip_is_exact(tmp_path, options):
    net = small(**options)
    if options["head"] == "linear":
        net.head.expand(2, seed=0)
    net.train()
    net(digits(8))  # move the batch-norm running statistics away from their defaults
    net.eval()
    path = tmp_path / "model.safetensors"
    save_checkpoint(net, path, extra={"task": 2})
    loaded = load_checkpoint(path)
    assert loaded.spec == net.spec
    with torch.no_grad():
        expected, actual = net(digits()), loaded.eval()(digits())
    assert torch.equal(expected.features, actual.features) and torch.equal(expected.logits, actual.logits)
    assert read_checkpoint_meta(path)["extra"] == {"task": 2}


def test_checkpoint_file_is_plain_safetensors(tmp_path):
    path = tmp_path / "model.safetensors"
    save_checkpoint(small("dsimplex", 4), path)
    raw = path.read_bytes()
    (header_size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_size])
    assert json.loads(header["__metadata__"]["meta"])["head"] == "dsimplex"


def test_load_rejects_foreign_and_future_files(tmp_path):
    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(1)}, str(foreign))
    with pytest.raises(ValueError, match="not a Compatibility Lab network checkpoint"):
        load_checkpoint(foreign)
    future = tmp_path / "future.safetensors"
    meta = {"backbone": "small_cnn", "head": "linear", "num_classes": 2, "feature_dim": 64, "dropout": 0.5}
    save_file({"w": torch.zeros(1)}, str(future), metadata={"format": "compatibility-lab/net/1", "meta": json.dumps(meta)})
    with pytest.raises(ValueError, match="unknown fields \\['dropout'\\]"):
        load_checkpoint(future)
