"""CropFollow's NavNet: head layout, both backbones, in-model normalisation."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from qaopt.simulators.cropfollow.nets import NavNet, ResNet18Backbone


def n_params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def test_resnet18_backbone_matches_the_reference_architecture():
    # torchvision's resnet18 has 11,689,512 parameters, 513,000 of them in its final FC.
    assert n_params(ResNet18Backbone()) == 11_689_512 - 513_000


def test_head_is_cropfollows():
    head = NavNet("heading", "compact").head
    kinds = [type(m).__name__ for m in head]
    assert kinds == ["Conv2d", "BatchNorm2d", "ReLU", "AdaptiveAvgPool2d", "Flatten", "Linear", "ReLU", "Dropout", "Linear"]
    assert head[0].out_channels == 512 and head[0].kernel_size == (3, 3)
    assert (head[5].in_features, head[5].out_features, head[8].out_features) == (512, 64, 1)


@pytest.mark.parametrize("backbone", ["compact", "resnet18"])
def test_shapes_and_units(backbone):
    torch.manual_seed(0)
    model = NavNet("distance", backbone).eval()
    with torch.inference_mode():
        y = model(torch.rand(2, 3, 240, 320))
    assert y.shape == (2, 1) and y.dtype == torch.float32
    # The output is de-normalised inside the model: an untrained distance NN answers near 0.5.
    assert 0.0 < float(y.mean()) < 1.0
    assert n_params(model) < (15_000_000 if backbone == "resnet18" else 2_000_000)


def test_bad_target_or_backbone():
    with pytest.raises(ValueError, match="'target'"):
        NavNet("speed")
    with pytest.raises(ValueError, match="'backbone'"):
        NavNet("heading", "vgg")
