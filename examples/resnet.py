"""torchvision's ResNet-50 for `stepbench run --model examples/resnet.py:make`: random weights,
random 224x224 images and labels, cross-entropy; images per second counted.

Needs torchvision (`pip install 'stepbench[examples]'`).

    stepbench run --model examples/resnet.py:make --batch 128
    stepbench run --model examples/resnet.py:make --device cpu --batch 2 --param image_size=32 \\
        --param arch=resnet18
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import stepbench


def make(batch_size: int, device: str, image_size: int = 224, arch: str = "resnet50",
         num_classes: int = 1000):
    import torchvision

    model = getattr(torchvision.models, arch)(weights=None, num_classes=num_classes).to(device)
    gen = torch.Generator().manual_seed(1)
    images = torch.randn(batch_size, 3, image_size, image_size, generator=gen).to(device)
    labels = torch.randint(0, num_classes, (batch_size,), generator=gen).to(device)
    return stepbench.Workload(
        model=model, make_batch=lambda: images,
        loss_fn=lambda logits, _: F.cross_entropy(logits.float(), labels),
        units="images")
