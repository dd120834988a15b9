"""apex's Python-level pieces that have no other home in shim (most apex names map to ``shim.nn`` /
``shim.optim``; see rules/apex.toml): ``shim.apex.multi_tensor_apply``."""

import importlib as _importlib

__all__ = ['multi_tensor_apply']


def __getattr__(name: str):
    """Submodules load on first use (``shim.kernels.amp_C`` as an attribute, the way migrated code spells it)."""
    try:
        return _importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
