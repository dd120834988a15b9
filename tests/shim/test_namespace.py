"""shim is all of torch, plus: names forward to torch's own objects; torch is left untouched."""

import importlib
import subprocess
import sys

import torch

import shim


def test_torch_names_are_torch_objects():
    assert shim.Tensor is torch.Tensor
    assert shim.float32 is torch.float32
    assert shim.matmul is torch.matmul
    assert shim.nn.Linear is torch.nn.Linear
    assert shim.optim.AdamW is torch.optim.AdamW


def test_unwritten_submodules_alias_torch_modules():
    data = importlib.import_module("shim.utils.data")
    assert data is torch.utils.data
    assert importlib.import_module("shim.autograd") is torch.autograd
    # the alias does not re-stamp torch's module
    assert torch.autograd.__spec__.name == "torch.autograd"


def test_import_forms():
    code = (
        "import shim as torch\n"
        "import shim.nn.functional as F\n"
        "from shim.nn import Module\n"
        "from shim.utils.data import DataLoader\n"
        "import torch as real\n"
        "assert F.relu is real.nn.functional.relu\n"
        "assert Module is real.nn.Module and DataLoader is real.utils.data.DataLoader\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_missing_name_is_attribute_error():
    try:
        shim.nn.definitely_not_a_thing
    except AttributeError as exc:
        assert "definitely_not_a_thing" in str(exc)
    else:  # pragma: no cover
        raise AssertionError("expected AttributeError")


def test_importing_shim_changes_nothing_in_torch():
    code = (
        "import sys, torch\n"
        "before = {k: id(v) for k, v in vars(torch).items()}\n"
        "mods = set(sys.modules)\n"
        "import shim, shim.nn, shim.optim, shim.nn.functional\n"
        "after = {k: id(v) for k, v in vars(torch).items()}\n"
        "assert before == after, set(before.items()) ^ set(after.items())\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_star_imports_export_torch_names_and_shims():
    import shim.distributed

    expected = {
        "shim.distributed": {"all_reduce", "ReduceOp", "DistributedDataParallel", "setup_dist_util"},
        "shim.nn": {"Linear", "FusedLayerNorm", "Linear1D"},
        "shim.optim": {"AdamW", "FusedAdam"},
        "shim.nn.functional": {"relu", "sparse_softmax_cross_entropy"},
    }
    for module, names in expected.items():
        namespace: dict = {}
        exec(f"from {module} import *", namespace)
        assert names <= namespace.keys(), (module, names - namespace.keys())
    namespace = {}
    exec("from shim.distributed import *", namespace)
    assert namespace["all_reduce"] is shim.distributed.all_reduce  # shim's, not torch's
