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


def _conv(cin: int, cout: int, k: int, bias: bool = False) -> int:
    return cin * cout * k * k + (cout if bias else 0)


def test_resnet32_cifar_has_64_features_and_the_papers_parameter_count():
    # He et al.'s ResNet-32, counted by hand: stem, 3 stages x 5 blocks x 2 convs (16/32/64), BN weight + bias;
    # option-A shortcuts have no parameters. Paper 002 Sec. 5.5: "ResNet32 (0.46M)" (with a classifier).
    convs = _conv(3, 16, 3)
    bn = 2 * 16
    cin = 16
    for planes in (16, 32, 64):
        for _ in range(5):
            convs += _conv(cin, planes, 3) + _conv(planes, planes, 3)
            bn += 2 * 2 * planes
            cin = planes
    assert convs + bn == 463_504
    model, dim = build_backbone("resnet32_cifar")
    assert dim == 64
    assert sum(p.numel() for p in model.parameters()) == 463_504
    assert round((463_504 + _conv(64, 10, 1, bias=True)) / 1e6, 2) == 0.46  # with a 10-class classifier
    model.eval()
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 64)
    gray, _ = build_backbone("resnet32_cifar", in_channels=1)
    assert gray.eval()(torch.zeros(1, 1, 32, 32)).shape == (1, 64)


def test_senet18_cifar_has_512_features_and_the_counted_parameters():
    # kuangliu/pytorch-cifar SENet18: stem, 4 stages x 2 pre-activation SE blocks; counted by hand per block.
    total = _conv(3, 64, 3) + 2 * 64
    cin = 64
    for planes, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for i in range(2):
            s = stride if i == 0 else 1
            total += 2 * cin + _conv(cin, planes, 3) + 2 * planes + _conv(planes, planes, 3)
            total += _conv(cin, planes, 1) if s != 1 or cin != planes else 0
            total += _conv(planes, planes // 16, 1, bias=True) + _conv(planes // 16, planes, 1, bias=True)
            cin = planes
    # 11.26M with a 10-class classifier, the usual figure for this network; paper 002 Sec. 5.5 prints "1.23M"
    assert total == 11_255_224
    assert round((total + _conv(512, 10, 1, bias=True)) / 1e6, 2) == 11.26
    model, dim = build_backbone("senet18_cifar")
    assert dim == 512
    assert sum(p.numel() for p in model.parameters()) == total
    assert model.eval()(torch.zeros(2, 3, 32, 32)).shape == (2, 512)


@pytest.mark.parametrize(("shape", "width"), [((2, 1, 28, 28), 128), ((2, 3, 32, 32), 64), ((2, 1, 8, 8), 16)])
def test_small_fc_cnn_output_dim_is_its_width(shape, width):
    model, dim = build_backbone("small_fc_cnn", in_channels=shape[1], width=width)
    assert dim == width
    model.eval()
    with torch.no_grad():
        out = model(torch.randn(*shape))
    assert out.shape == (2, width) and (out >= 0).all()  # ReLU after the fully connected layer


def test_small_fc_cnn_parameter_count_by_hand():
    # conv 1 -> 16 and 16 -> 32 (3x3, no bias) with BN weight + bias, then 32 x 7 x 7 -> 128 with bias
    model, _ = build_backbone("small_fc_cnn", in_channels=1, width=128)
    expected = _conv(1, 16, 3) + 2 * 16 + _conv(16, 32, 3) + 2 * 32 + 32 * 49 * 128 + 128
    assert sum(p.numel() for p in model.parameters()) == expected == 205_680
