"""The torch-free architecture table (engine.checkpoints.arch_table) names exactly what the engine builds."""
from engine.checkpoints import archs
from engine.checkpoints.arch_table import (
    ARCH_INPUTS,
    IMAGENET_MEAN,
    LITE_INPUT_SIZES,
    PROJECT_ARCHS,
    TORCHVISION_INPUT_SIZE,
    TORCHVISION_NAMES,
)
from engine.checkpoints.pretrained import LITE_WEIGHT_PACKAGES
from engine.models import TORCHVISION_ARCHS


def test_the_table_names_the_builders_and_the_torchvision_registry():
    assert list(ARCH_INPUTS) == list(archs.ARCHITECTURES)
    assert TORCHVISION_NAMES == tuple(TORCHVISION_ARCHS)
    assert PROJECT_ARCHS == tuple(archs._PROJECT_STEMS)
    assert set(LITE_WEIGHT_PACKAGES) <= set(ARCH_INPUTS)
    for name, arch in TORCHVISION_ARCHS.items():  # an architecture with a fixed size must be fed that size
        assert ARCH_INPUTS[name].input_size == (arch.input_size or TORCHVISION_INPUT_SIZE), name
    for name, entry in archs.ARCHITECTURES.items():
        inputs = ARCH_INPUTS[name]
        assert (entry.input_size, entry.mean, entry.std, entry.in_channels) == \
            (inputs.input_size, inputs.mean, inputs.std, inputs.in_channels), name


def test_the_defaults_are_the_published_ones():
    assert ARCH_INPUTS["resnet18"].input_size == 224 and ARCH_INPUTS["resnet18"].mean == IMAGENET_MEAN == (0.485, 0.456, 0.406)
    assert ARCH_INPUTS["vit_b_16"].input_size == 224
    assert [ARCH_INPUTS[f"efficientnet_lite{i}"].input_size for i in LITE_INPUT_SIZES] == [224, 240, 260, 280, 300]
    assert ARCH_INPUTS["efficientnet_lite0"].mean == (127 / 255,) * 3 and ARCH_INPUTS["efficientnet_lite0"].std == (128 / 255,) * 3
    small = ARCH_INPUTS["small_cnn"]
    assert (small.input_size, small.mean, small.std, small.in_channels) == (None, None, None, None)
