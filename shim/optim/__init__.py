"""torch.optim plus apex / DeepSpeed optimizer fallbacks."""

import torch.optim as _torch_optim

from shim._forward import forward_to as _forward_to
from shim._lazy import lazy_names as _lazy_names

# name -> module that defines it (imported on first use)
_OWN = {
    "FusedAdam": "shim.optim.fused",
    "FusedSGD": "shim.optim.fused",
    "DeepSpeedCPUAdam": "shim.optim.fused",
}

_torch_getattr, _torch_dir = _forward_to(_torch_optim, globals())
__getattr__ = _lazy_names(globals(), _OWN, _torch_getattr)


def __dir__():
    return sorted(set(_torch_dir()) | set(_OWN))
