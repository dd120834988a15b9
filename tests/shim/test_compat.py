"""shim.compat.install(): CUDA-era calls on torch itself run on the active device; uninstall restores all."""

import io
import subprocess
import sys
import textwrap
import threading

import pytest
import torch

import shim.compat
from shim.compat import cudaless, devices, six

from ..conftest import free_port

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CUDA-less meaning")


@pytest.fixture
def compat(monkeypatch):
    monkeypatch.delenv("SHIM_DEVICE", raising=False)
    with shim.compat.installed():
        yield


def _run(code: str) -> None:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]


def test_uninstall_restores_every_patched_attribute_exactly():
    _run(
        """
        import sys, torch, torch.distributed, torch.distributed.distributed_c10d as c10d, torch.nn.parallel
        OWNERS = {"torch": torch, "torch.cuda": torch.cuda, "Tensor": torch.Tensor, "Module": torch.nn.Module,
                  "torch.distributed": torch.distributed, "c10d": c10d,
                  "DDP": torch.nn.parallel.DistributedDataParallel}

        def snapshot():
            snap = {(o, k): v for o, owner in OWNERS.items() for k, v in list(vars(owner).items())}
            snap[("sys.modules", "torch._six")] = sys.modules.get("torch._six")
            snap.update({("jit builtins", k): v for k, v in torch.jit._builtins._get_builtin_table().items()})
            return snap

        def changed(a, b):
            return sorted(str(k) for k in set(a) | set(b) if a.get(k, "absent") is not b.get(k, "absent"))

        import shim.compat
        before = snapshot()
        shim.compat.install()
        during = snapshot()
        shim.compat.install()  # idempotent: nothing more changes
        assert changed(during, snapshot()) == []
        patched = changed(before, during)
        assert len(patched) > 60, patched
        for key in [("torch", "_six"), ("torch.cuda", "LongTensor"), ("torch", "zeros"), ("Tensor", "cuda"),
                    ("Tensor", "to"), ("Module", "cuda"), ("torch", "load"), ("DDP", "__init__"), ("c10d", "init_process_group")]:
            assert str(key) in patched, key
        shim.compat.uninstall()
        assert changed(before, snapshot()) == [], changed(before, snapshot())
        shim.compat.uninstall()  # idempotent
        assert not shim.compat.is_installed() and not hasattr(torch, "_six") and "torch._six" not in sys.modules
        """
    )


def test_planned_changes_dry_run(monkeypatch):
    monkeypatch.delenv("SHIM_DEVICE", raising=False)
    planned = shim.compat.planned_changes()
    for name in ["torch._six", "torch.cuda.LongTensor", "torch.zeros", "torch.Tensor.to", "torch.load",
                 "torch.distributed.init_process_group"]:  # fmt: skip
        assert name in planned, name
    assert not shim.compat.is_installed() and not hasattr(torch, "_six")
    monkeypatch.setenv("SHIM_DEVICE", "cuda")  # on a CUDA device: torch._six, and torch.load's old default
    assert shim.compat.planned_changes() == ["torch._six", "sys.modules['torch._six']", "torch.load"]
    listed = subprocess.run([sys.executable, "-m", "shim.compat"], capture_output=True, text=True, timeout=120, check=True)
    assert "active device: cuda" in listed.stdout and "torch._six" in listed.stdout


def test_install_state_and_context_manager():
    assert not shim.compat.is_installed()
    with shim.compat.installed():
        assert shim.compat.is_installed()
        with shim.compat.installed():  # nested: the outer block keeps it
            pass
        assert shim.compat.is_installed()
    assert not shim.compat.is_installed()


def test_failed_install_leaves_torch_untouched(monkeypatch):
    monkeypatch.delenv("SHIM_DEVICE", raising=False)
    before = dict(vars(torch))
    broken = [(torch, "_six", six), (torch.cuda, "device_count", cudaless.device_count), (type(None), "x", 1)]
    monkeypatch.setattr(shim.compat, "_patches", lambda: broken)  # the last one cannot be set
    with pytest.raises(TypeError):
        shim.compat.install()
    assert not shim.compat.is_installed()
    after = dict(vars(torch))
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)
    assert torch.cuda.device_count is not cudaless.device_count


def test_torch_six(compat):
    import torch._six
    from torch._six import container_abcs, inf, int_classes, nan, string_classes

    assert torch._six is six and inf == float("inf") and nan != nan
    assert isinstance("x", string_classes) and isinstance(3, int_classes) and container_abcs.Mapping


def test_torch_cuda_names_are_shims(compat):
    for name in cudaless.__all__:
        assert getattr(torch.cuda, name) is getattr(cudaless, name), name
    assert torch.cuda.is_available() is False
    torch.cuda.set_device(0 % torch.cuda.device_count())
    assert torch.cuda.LongTensor([1, 2]).tolist() == [1, 2]
    assert isinstance(torch.cuda.FloatTensor(2, 3), torch.cuda.FloatTensor)
    from torch.cuda import _lazy_call, device as device_ctx_manager  # mpu/random.py's import

    with device_ctx_manager(-1):
        _lazy_call(lambda: torch.cuda.default_generators[torch.cuda.current_device()].manual_seed(5))
    assert torch.initial_seed() == 5


def test_torch_manual_seed_still_works(compat):
    # torch.manual_seed calls torch.cuda.manual_seed_all: the shim must not call back into it
    torch.manual_seed(11)
    assert torch.cuda.initial_seed() == 11
    torch.seed()


def test_factory_list_is_read_from_torch():
    names = devices.factory_names()
    for expected in ["empty", "zeros", "ones", "full", "rand", "randn", "randint", "arange", "tensor", "as_tensor",
                     "asarray", "eye", "linspace", "empty_like", "zeros_like", "randperm", "empty_strided"]:  # fmt: skip
        assert expected in names, expected
    assert "add" not in names and "matmul" not in names


def _uses_factories(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float64) + torch.zeros(3, dtype=torch.float64) * torch.arange(3)


CUDA_DEVICES = ["cuda", "cuda:0", torch.device("cuda"), torch.device("cuda", 0), 0]


@pytest.mark.parametrize("device", CUDA_DEVICES, ids=str)
def test_factories_with_cuda_devices(compat, device):
    like = torch.ones(2)
    made = [
        torch.empty(2, device=device), torch.zeros(2, 3, device=device), torch.ones(2, device=device),
        torch.full((2,), 7.0, device=device), torch.rand(2, device=device), torch.randn(2, device=device),
        torch.randint(0, 5, (2,), device=device), torch.arange(4, device=device), torch.tensor([1, 2], device=device),
        torch.as_tensor([1.0], device=device), torch.asarray([1.0], device=device), torch.eye(2, device=device),
        torch.linspace(0, 1, 3, device=device), torch.empty_like(like, device=device), torch.zeros_like(like, device=device),
        torch.randperm(3, device=device), like.new_zeros(2, device=device), like.new_ones(2, device=device),
        like.new_full((2,), 1.0, device=device), like.new_empty(2, device=device), like.new_tensor([1], device=device),
    ]  # fmt: skip
    assert all(t.device == torch.device("cpu") for t in made)


@pytest.mark.parametrize("device", CUDA_DEVICES, ids=str)
def test_to_with_cuda_devices(compat, device):
    x = torch.ones(2)
    assert x.to(device).device.type == "cpu"
    assert x.to(device, torch.float16).dtype == torch.float16
    assert x.to(device=device, dtype=torch.float64).dtype == torch.float64
    assert x.to(device, non_blocking=True) is x
    module = torch.nn.Linear(2, 2).to(device)
    assert module.weight.device.type == "cpu"
    assert torch.nn.Linear(2, 2, device="meta").to_empty(device=device).weight.device.type == "cpu"


@pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated")
def test_torchscript_still_compiles_factories(compat):
    scripted = torch.jit.script(_uses_factories)
    assert scripted(torch.ones(3)).tolist() == [1.0, 1.0, 1.0]
    assert torch.zeros(2, device="cuda").device.type == "cpu"  # eager calls still map


def test_other_devices_and_to_forms_untouched(compat):
    x = torch.ones(2)
    assert torch.zeros(2, device="meta").device.type == "meta"
    assert x.to("meta").device.type == "meta"
    assert x.to(torch.float64).dtype == torch.float64
    assert x.to(torch.ones(1, dtype=torch.int32)).dtype == torch.int32
    assert torch.nn.Linear(2, 2).to(torch.float64).weight.dtype == torch.float64


def test_dot_cuda(compat):
    x = torch.ones(2, requires_grad=True)
    y = x.cuda()
    assert y is x and x.cuda(0, non_blocking=True) is x
    y.sum().backward()
    assert x.grad is not None
    model = torch.nn.Linear(3, 2).cuda(torch.cuda.current_device())
    assert isinstance(model, torch.nn.Linear) and model.weight.device.type == "cpu"
    assert torch.nn.Linear(3, 2).half().cuda().weight.dtype == torch.float16


def _gpu_saved_checkpoint(monkeypatch) -> io.BytesIO:
    """A checkpoint whose tensors say they were saved on cuda:0, as released GLM checkpoints were."""
    buffer = io.BytesIO()
    with monkeypatch.context() as patch:
        patch.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        torch.save({"weight": torch.arange(3.0)}, buffer)
    buffer.seek(0)
    return buffer


def test_load_gpu_saved_checkpoint(monkeypatch):
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(_gpu_saved_checkpoint(monkeypatch))
    with shim.compat.installed():
        for map_location in [None, "cuda", torch.device("cuda", 0), "cpu"]:
            loaded = torch.load(_gpu_saved_checkpoint(monkeypatch), map_location)
            assert loaded["weight"].device.type == "cpu" and loaded["weight"].tolist() == [0.0, 1.0, 2.0]
        assert torch.load(_gpu_saved_checkpoint(monkeypatch), map_location="meta")["weight"].is_meta


def test_seen_by_other_threads(compat):
    results = []
    thread = threading.Thread(target=lambda: results.append(torch.zeros(1, device="cuda").cuda().device))
    thread.start()
    thread.join()
    assert results == [torch.device("cpu")]


class _RecomputeInBackward(torch.autograd.Function):
    """mpu's CheckpointFunction in miniature: the forward's 'cuda' code runs again inside backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.ones(x.shape, device="cuda")

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            x = x.detach().requires_grad_()
            y = x * torch.ones(x.shape, device="cuda") + torch.cuda.FloatTensor([1.0])
        return torch.autograd.grad(y, x, grad)[0]


def test_reaches_recomputation_in_backward(compat):
    x = torch.randn(3, requires_grad=True)
    _RecomputeInBackward.apply(x).sum().backward()
    torch.testing.assert_close(x.grad, torch.ones(3))


def test_nccl_becomes_gloo_and_ddp_takes_gpu_ids():
    _run(
        """
        import torch, torch.distributed as dist, shim.compat
        shim.compat.install()
        port = PORT
        dist.init_process_group(backend="nccl", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
        assert dist.get_backend() == "gloo"
        group = dist.new_group([0], None, "nccl")
        assert dist.get_backend(group) == "gloo"
        i = torch.cuda.current_device()
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 1).cuda(i), device_ids=[i], output_device=i)
        assert type(model) is torch.nn.parallel.DistributedDataParallel
        model(torch.ones(2, 3, device="cuda")).sum().backward()
        assert model.module.weight.grad is not None
        del model  # DDP before its process group, or gloo's teardown can hang
        dist.destroy_process_group()
        shim.compat.uninstall()
        """.replace("PORT", str(free_port()))
    )
