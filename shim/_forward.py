"""How shim stays "all of torch, plus": namespace forwarding and submodule aliasing.

Every shim module that extends a torch module (``shim.nn`` extends ``torch.nn``,
``shim.optim`` extends ``torch.optim``...) imports its own additions with ordinary
import statements and ends with::

    __getattr__, __dir__ = forward_to(torch.distributed, globals(), lazy=(_pipeline,))

so any name it does not define resolves to torch's own object. Additions whose module
is slow to import (DTensor, pipelining: seconds) are imported inside a *loader*
function instead, run on first use of any name it imports::

    def _pipeline():
        from shim.distributed.pipeline import pipeline_schedule, stage_layers
        return locals()

The import statements are the only list of names (go-to-definition follows them), and
importing shim stays as cheap as importing torch. Submodules that
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
from collections.abc import Callable, Iterable

SHIM = "shim"


def forward_to(torch_module: types.ModuleType, namespace: dict, lazy: Iterable[Callable[[], dict]] = ()):
    """Return ``(__getattr__, __dir__)`` for a shim module that extends ``torch_module``.

    ``lazy``: loader functions, each made of import statements and ``return locals()``;
    the names a loader imports are its local variables, and it runs on first use of one.
    """
    loaders = lazy_loaders(*lazy)

    def __getattr__(name: str):
        if name == "__all__":  # what `from <shim module> import *` exports: torch's public names, then ours
            return sorted(_public_names(torch_module, namespace) | set(loaders))
        if name in loaders:
            namespace.update(loaders[name]())
            return namespace[name]
        try:
            return getattr(torch_module, name)
        except AttributeError:
            raise AttributeError(
                f"module {namespace['__name__']!r} (shim of {torch_module.__name__!r}) "
                f"has no attribute {name!r}"
            ) from None

    def __dir__():
        return sorted(set(namespace) | set(dir(torch_module)) | set(loaders))

    return __getattr__, __dir__


def lazy_loaders(*loaders: Callable[[], dict]) -> dict[str, Callable[[], dict]]:
    """``{name: loader}`` for loaders that import names as their local variables (see above)."""
    by_name = {}
    for loader in loaders:
        code = loader.__code__
        if code.co_argcount or not code.co_varnames:
            raise TypeError(f"lazy loader {loader.__qualname__} must take no arguments and import names")
        by_name.update(dict.fromkeys(code.co_varnames, loader))
    return by_name


def submodules_on_first_use(package: str) -> Callable[[str], types.ModuleType]:
    """A package's module ``__getattr__`` that imports ``package.NAME`` when ``NAME`` is first read (as
    migrated code spells an extension, ``shim.kernels.amp_C``), and raises AttributeError for no such module."""

    def __getattr__(name: str) -> types.ModuleType:
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"{package}.{name}":
                raise
            raise AttributeError(f"module {package!r} has no attribute {name!r}") from None

    return __getattr__


def _public_names(torch_module: types.ModuleType, namespace: dict) -> set[str]:
    torch_public = getattr(torch_module, "__all__", None) or [n for n in dir(torch_module) if not n.startswith("_")]
    own = {
        name
        for name, value in namespace.items()
        # shim's own submodules (shim.nn.normalization...) are attributes once imported, not exports
        if not name.startswith("_") and not (isinstance(value, types.ModuleType) and _is_genuine_shim(value))
    }
    return set(torch_public) | own


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
