"""``torch.load`` as torch < 2.6 did it: ``weights_only=False`` unless the caller says otherwise.

torch 2.6 made ``torch.load(weights_only=True)`` the default. GLM-era checkpoints are whole pickles:
``utils.save_checkpoint`` stores the run's ``argparse.Namespace`` and the Python, NumPy, torch and
CUDA RNG states beside the weights, so the new default refuses them (``_pickle.UnpicklingError:
Weights only load failed``) and ``pretrain_glm.py --load`` / ``finetune_glm.py --load-pretrained``
stop before their first step.

The trust decision: a checkpoint the code loads is one its user named on the command line
(``--load``, ``--load-pretrained``, ``change_mp.py``'s argument), made by that user's own run or
downloaded by them, and unpickling it is what the code was written to do. So glm-mock (through
``shim.compat.install()``) restores the old default, and glm-migrate writes ``weights_only=False``
into each ``torch.load`` call that does not pass it (rule TRC003), where a reader of the migrated
code sees it. Never point such code at a file you would not run: unpickling runs code. Setting
``TORCH_FORCE_WEIGHTS_ONLY_LOAD=1`` still makes torch refuse anything but weights, explicit
``weights_only=False`` included.
"""

from __future__ import annotations

import functools

__all__ = ["trusting_load"]


def trusting_load(load):
    """``load`` (torch.load) with ``weights_only`` False when the caller leaves it out or passes None."""

    @functools.wraps(load)
    def wrapper(*args, **kwargs):
        if kwargs.get("weights_only") is None:
            kwargs["weights_only"] = False
        return load(*args, **kwargs)

    return wrapper
