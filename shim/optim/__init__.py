"""torch.optim plus apex / DeepSpeed optimizer fallbacks (:mod:`shim.optim.fused`)."""

import torch.optim as _torch_optim

from shim._forward import forward_to as _forward_to
from shim.optim.fused import DeepSpeedCPUAdam, FusedAdam, FusedSGD  # noqa: F401 (exported)

__getattr__, __dir__ = _forward_to(_torch_optim, globals())
