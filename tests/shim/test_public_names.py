"""Every shim module says what it exports (``__all__``), and every exported name resolves.

Names whose modules are slow to import (DTensor, pipelining) are loaded on first use
(``shim._forward.forward_to(..., lazy=...)``): importing shim and its torch-shaped
modules must not import them, and the lazy name must be the defining module's object.
"""

import importlib
import pkgutil
import subprocess
import sys
import types

import pytest

import shim
from shim import _forward

# Modules that run something when imported (`python -m shim.compat`) rather than define names.
NOT_IMPORTED = {"shim.compat.__main__"}


def public_modules() -> list[str]:
    names = ["shim"]
    for info in pkgutil.walk_packages(shim.__path__, "shim."):
        if info.name in NOT_IMPORTED or any(part.startswith("_") for part in info.name.split(".")):
            continue
        names.append(info.name)
    return names


MODULES = public_modules()


def test_the_walk_finds_shims_modules():
    assert {"shim.nn", "shim.ops.cross_entropy", "shim.distributed.layout", "shim.mpu.layers", "shim.recompute"} <= set(
        MODULES
    )


@pytest.mark.parametrize("name", MODULES)
def test_public_names_resolve(name):
    module = importlib.import_module(name)
    exported = getattr(module, "__all__", None)
    assert exported, f"{name} has no __all__"
    assert len(set(exported)) == len(exported), f"{name}.__all__ repeats a name"
    missing = [n for n in exported if not _resolves(module, n)]
    assert not missing, f"{name}.__all__ names that do not resolve: {missing}"


def _resolves(module, name) -> bool:
    try:
        getattr(module, name)
    except AttributeError:
        return False
    return True


FORWARDING = ["shim", "shim.nn", "shim.nn.functional", "shim.optim", "shim.distributed"]  # shim.cuda only re-means torch names


@pytest.mark.parametrize("name", FORWARDING)
def test_own_names_are_the_defining_modules_objects(name):
    """A name shim adds to a torch namespace is the object its defining module has, never a copy."""
    module = importlib.import_module(name)
    torch_names = set(dir(importlib.import_module("torch" + name[len("shim"):])))
    own = sorted(set(dir(module)) - torch_names)
    assert own, name
    for attribute in own:
        value = getattr(module, attribute)
        if isinstance(value, types.ModuleType) or attribute.startswith("_"):
            continue
        home = sys.modules[value.__module__]
        assert home.__name__.startswith("shim.") and getattr(home, value.__name__) is value, (name, attribute)


def test_lazy_loaders_list_only_imported_names():
    import shim.distributed
    import shim.nn

    for module, loaders in [(shim.distributed, ("_pipeline",)), (shim, ("_global_tensor",))]:
        for loader_name in loaders:
            loader = getattr(module, loader_name)
            names = set(_forward.lazy_loaders(loader))
            assert names == set(loader()), loader_name
            exported = set(dir(module)) if module is shim else set(module.__all__)  # shim's * is torch's
            assert names <= exported, (loader_name, names - exported)


def test_importing_shim_does_not_import_dtensor_or_pipelining():
    code = (
        "import sys\n"
        "import shim, shim.nn, shim.nn.functional, shim.optim, shim.distributed, shim.cuda\n"
        "shim.nn.FusedLayerNorm, shim.nn.Linear1D(4, 4, parallel='col'), shim.optim.FusedAdam\n"
        "shim.distributed.all_reduce, shim.distributed.setup_layout, shim.device()\n"
        "slow = [m for m in ('torch.distributed.tensor', 'torch.distributed.pipelining') if m in sys.modules]\n"
        "assert not slow, slow\n"
        "import shim.distributed.pipeline, shim.global_tensor\n"
        "assert shim.distributed.stage_layers is shim.distributed.pipeline.stage_layers\n"
        "assert shim.placement is shim.global_tensor.placement\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_loader_must_import_names():
    def takes_an_argument(x):
        return locals()

    with pytest.raises(TypeError, match="must take no arguments"):
        _forward.lazy_loaders(takes_an_argument)
