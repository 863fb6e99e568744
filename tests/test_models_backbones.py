"""Backbones: output shapes, the CIFAR ResNet-18 stem, torchvision classifier removal, the registry."""
import pytest
import torch
from torch import nn

from engine.models import BACKBONES, TORCHVISION_ARCHS, Projection, build_backbone


def test_resnet18_cifar_maps_32x32_images_to_512_features():
    model, dim = build_backbone("resnet18_cifar", in_channels=3)
    assert dim == 512
    assert model.conv1.kernel_size == (3, 3) and model.conv1.stride == (1, 1)
    assert isinstance(model.maxpool, nn.Identity) and isinstance(model.fc, nn.Identity)
    model.eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, 32, 32)).shape == (2, 512)


def test_resnet18_cifar_accepts_grayscale():
    model, _ = build_backbone("resnet18_cifar", in_channels=1)
    model.eval()
    with torch.no_grad():
        assert model(torch.randn(1, 1, 32, 32)).shape == (1, 512)


@pytest.mark.parametrize(("shape", "width"), [((2, 1, 8, 8), 64), ((2, 3, 32, 32), 128)])
def test_small_cnn_output_dim_is_configurable(shape, width):
    model, dim = build_backbone("small_cnn", in_channels=shape[1], width=width)
    assert dim == width
    assert model(torch.randn(*shape)).shape == (2, width)


def test_small_cnn_default_width():
    _, dim = build_backbone("small_cnn")
    assert dim == 64


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small", "regnet_y_400mf"])
def test_torchvision_backbones_output_penultimate_features(name):
    model, dim = build_backbone(name)
    assert dim == TORCHVISION_ARCHS[name].feature_dim
    model.eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 64)).shape == (1, dim)


def test_registry_errors_are_actionable():
    with pytest.raises(ValueError, match="known backbones: .*resnet18_cifar.*small_cnn"):
        build_backbone("resnet9000")
    with pytest.raises(ValueError, match="3-channel"):
        build_backbone("resnet18", in_channels=1)
    with pytest.raises(ValueError, match="width"):
        build_backbone("resnet18_cifar", width=128)


def test_registry_lists_the_paper_architectures():
    for name in ["small_cnn", "resnet18_cifar", "resnet18", "resnet34", "resnet50", "alexnet", "regnet_x_3_2gf",
                 "resnet152", "maxvit_t", "vit_b_32", "vit_b_16", "vit_l_16"]:
        assert name in BACKBONES


def test_projection_is_bias_free():
    projection = Projection(8, 3)
    assert projection.linear.bias is None
    assert projection(torch.randn(2, 8)).shape == (2, 3)
