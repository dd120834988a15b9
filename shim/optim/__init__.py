"""torch.optim plus apex / DeepSpeed optimizer fallbacks."""

import torch.optim as _torch_optim

from shim._forward import forward_to as _forward_to

# name -> module that defines it (imported on first use)
_OWN = {
    "FusedAdam": "shim.optim.fused",
    "FusedSGD": "shim.optim.fused",
    "DeepSpeedCPUAdam": "shim.optim.fused",
}

__getattr__, __dir__ = _forward_to(_torch_optim, globals(), own=_OWN)
