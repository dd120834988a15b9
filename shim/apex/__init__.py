"""apex's Python-level pieces that have no other home in shim (most apex names map to ``shim.nn`` /
``shim.optim``; see rules/apex.toml): ``shim.apex.multi_tensor_apply``."""

from shim._forward import submodules_on_first_use as _submodules_on_first_use

__all__ = ['multi_tensor_apply']


# Submodules load on first use (``shim.kernels.amp_C`` as an attribute, the way migrated code spells it).
__getattr__ = _submodules_on_first_use(__name__)
