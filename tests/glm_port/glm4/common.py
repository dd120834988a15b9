"""What several GLM-4 test modules run a written model on (imported as ``tests.glm_port.glm4.common``)."""

import torch

from glm_port.models import FAMILIES

IDS = torch.tensor([[3, 17, 250, 9, 511, 40, 961, 7], [88, 300, 2, 64, 5, 6, 7, 8]])


def logits(directory):
    """The logits for ``IDS`` of the GLM-4 at ``directory`` as glm-generate loads it (fp32, CPU)."""
    model, _ = FAMILIES["glm4"].binding("generation").load(directory, dtype="fp32", device="cpu")
    with torch.no_grad():
        return model(IDS).logits
