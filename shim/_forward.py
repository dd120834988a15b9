"""How shim stays "all of torch, plus": namespace forwarding and submodule aliasing.

Every shim module that extends a torch module (``shim.nn`` extends ``torch.nn``,
``shim.optim`` extends ``torch.optim``...) ends with::

    __getattr__, __dir__ = forward_to(torch.nn, globals(), own={"FusedLayerNorm": "shim.nn.normalization"})

so any name it does not define resolves to torch's own object, and its own
additions are imported from their defining module on first use (importing shim
stays as cheap as importing torch). Submodules that
shim does not write itself (``shim.autograd``, ``shim.utils.data``...) are
aliased by ``TorchAliasFinder``: importing them yields torch's module object
itself, never a second copy, and nothing in torch is modified.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types

SHIM = "shim"


def forward_to(torch_module: types.ModuleType, namespace: dict, own: dict[str, str] | None = None):
    """Return ``(__getattr__, __dir__)`` for a shim module that extends ``torch_module``.

    ``own`` maps each name shim adds to the module defining it, imported on first use.
    """
    own = own or {}

    def __getattr__(name: str):
        if name == "__all__":  # what `from <shim module> import *` exports: torch's public names, then ours
            return sorted(_public_names(torch_module, namespace) | set(own))
        if name in own:
            value = getattr(importlib.import_module(own[name]), name)
            namespace[name] = value
            return value
        try:
            return getattr(torch_module, name)
        except AttributeError:
            raise AttributeError(
                f"module {namespace['__name__']!r} (shim of {torch_module.__name__!r}) "
                f"has no attribute {name!r}"
            ) from None

    def __dir__():
        return sorted(set(namespace) | set(dir(torch_module)) | set(own))

    return __getattr__, __dir__


def _public_names(torch_module: types.ModuleType, namespace: dict) -> set[str]:
    torch_public = getattr(torch_module, "__all__", None) or [n for n in dir(torch_module) if not n.startswith("_")]
    return set(torch_public) | {n for n in namespace if not n.startswith("_")}


def _is_genuine_shim(module: types.ModuleType | None) -> bool:
    return module is not None and getattr(module, "__name__", "").split(".")[0] == SHIM


class _AliasLoader(importlib.abc.Loader):
    """Loads ``shim.X`` as torch's ``torch.X`` module object, leaving torch untouched."""

    def __init__(self, torch_name: str):
        self.torch_name = torch_name
        self._saved: dict = {}

    def create_module(self, spec):
        module = importlib.import_module(self.torch_name)
        # The import system stamps the shim spec/loader onto the module; remember
        # torch's own so exec_module can put them back.
        self._saved = {k: module.__dict__[k] for k in ("__spec__", "__loader__") if k in module.__dict__}
        return module

    def exec_module(self, module):
        module.__dict__.update(self._saved)


class TorchAliasFinder(importlib.abc.MetaPathFinder):
    """Resolves ``shim.<path>`` to ``torch.<path>`` when shim has no module of its own there."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith(SHIM + "."):
            return None
        parent = sys.modules.get(fullname.rpartition(".")[0])
        if _is_genuine_shim(parent):
            own = importlib.machinery.PathFinder.find_spec(fullname, getattr(parent, "__path__", None))
            if own is not None:
                return own
        torch_name = "torch" + fullname[len(SHIM):]
        try:
            if importlib.util.find_spec(torch_name) is None:
                return None
        except ModuleNotFoundError:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(torch_name))


def install_alias_finder() -> None:
    if not any(isinstance(f, TorchAliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, TorchAliasFinder())
