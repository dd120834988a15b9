"""shim.device() and shim.cuda: GLM-era CUDA calls on a machine without CUDA."""

import importlib
import time

import pytest
import torch

import shim
from shim.compat import cudaless

needs_no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CUDA-less meaning")


@pytest.fixture
def no_env_device(monkeypatch):
    monkeypatch.delenv("SHIM_DEVICE", raising=False)


# ---- shim.device ----------------------------------------------------------------------------------


@needs_no_cuda
def test_active_device_is_cpu_without_cuda(no_env_device, monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert shim.device() == torch.device("cpu")


def test_active_device_is_local_rank_gpu_with_cuda(no_env_device, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert shim.device() == torch.device("cuda", 1)
    monkeypatch.delenv("LOCAL_RANK")
    assert shim.device() == torch.device("cuda", 0)
    monkeypatch.setenv("LOCAL_RANK", "one")
    with pytest.raises(ValueError, match="LOCAL_RANK='one'"):
        shim.device()


def test_env_overrides_active_device(monkeypatch):
    monkeypatch.setenv("SHIM_DEVICE", "cuda:3")
    assert shim.device() == torch.device("cuda", 3)
    monkeypatch.setenv("SHIM_DEVICE", "meta")
    assert shim.device() == torch.device("meta")


def test_bad_env_device_is_one_clear_line(monkeypatch):
    monkeypatch.setenv("SHIM_DEVICE", "gpu0")
    with pytest.raises(ValueError, match="SHIM_DEVICE='gpu0' is not a torch device"):
        shim.device()


def test_device_with_arguments_is_torch_device():
    assert shim.device("cpu") == torch.device("cpu")
    assert shim.device("cuda", 1) == torch.device("cuda:1")
    assert shim.device(type="cuda", index=0) == torch.device("cuda:0")
    assert type(shim.device("cpu")) is torch.device


def test_isinstance_and_issubclass():
    assert isinstance(torch.device("cpu"), shim.device)
    assert isinstance(shim.device(), shim.device)
    assert not isinstance("cpu", shim.device)
    assert issubclass(torch.device, shim.device)


# ---- shim.cuda ------------------------------------------------------------------------------------


@needs_no_cuda
def test_is_available_stays_honest(no_env_device):
    assert shim.cuda.is_available() is False
    assert shim.cuda.is_available is torch.cuda.is_available


@needs_no_cuda
def test_one_device_index_zero(no_env_device):
    assert shim.cuda.device_count() == 1
    for rank in range(4):  # GLM: torch.cuda.set_device(rank % torch.cuda.device_count())
        shim.cuda.set_device(rank % shim.cuda.device_count())
    shim.cuda.set_device(torch.device("cuda", 0))
    assert shim.cuda.current_device() == 0
    with pytest.raises(ValueError, match="one device, index 0"):
        shim.cuda.set_device(1)
    with shim.cuda.device(0), shim.cuda.device_of(torch.zeros(1)):
        pass


@needs_no_cuda
@pytest.mark.parametrize(
    "name, dtype",
    [("FloatTensor", torch.float32), ("LongTensor", torch.int64), ("HalfTensor", torch.float16),
     ("BFloat16Tensor", torch.bfloat16), ("IntTensor", torch.int32), ("ByteTensor", torch.uint8),
     ("BoolTensor", torch.bool), ("DoubleTensor", torch.float64)],
)  # fmt: skip
def test_legacy_tensor_types(no_env_device, name, dtype):
    legacy = getattr(shim.cuda, name)
    data = legacy([1, 0, 1])
    assert data.dtype == dtype and data.device == shim.device() and data.tolist() == [1, 0, 1]
    assert legacy(3, 4).shape == (3, 4)
    assert legacy(torch.Size([2, 5])).shape == (2, 5)
    assert legacy().shape == (0,)
    assert isinstance(data, legacy)
    assert not isinstance(torch.zeros(1, dtype=torch.complex64), legacy)
    assert legacy.__name__ == name


@needs_no_cuda
def test_legacy_types_follow_active_device(monkeypatch):
    monkeypatch.setenv("SHIM_DEVICE", "meta")
    assert shim.cuda.LongTensor([1, 2]).device == torch.device("meta")
    assert not isinstance(torch.zeros(1, dtype=torch.long), shim.cuda.LongTensor)


@needs_no_cuda
def test_rng_is_the_cpu_default_generator(no_env_device):
    assert shim.cuda.default_generators == (torch.default_generator,)
    shim.cuda.manual_seed(1234)
    assert shim.cuda.initial_seed() == 1234
    state = shim.cuda.get_rng_state()
    first = torch.rand(4)  # CPU dropout draws from this generator
    shim.cuda.set_rng_state(state)
    assert torch.equal(torch.rand(4), first)
    shim.cuda.manual_seed_all(7)
    assert torch.initial_seed() == 7
    shim.cuda.set_rng_state_all(shim.cuda.get_rng_state_all())
    # Megatron's _set_cuda_rng_state path: default_generators[current_device()].set_state
    shim.cuda.default_generators[shim.cuda.current_device()].set_state(state)
    assert torch.equal(torch.rand(4), first)


@needs_no_cuda
def test_lazy_call_runs_now(no_env_device):
    calls = []
    shim.cuda._lazy_call(lambda: calls.append(1))
    assert calls == [1]


@needs_no_cuda
def test_streams_and_sync_are_noops(no_env_device):
    stream = shim.cuda.Stream(device=shim.cuda.current_device())
    default = shim.cuda.current_stream()
    assert default is shim.cuda.default_stream()
    with shim.cuda.stream(stream):
        assert shim.cuda.current_stream() is stream
        stream.wait_stream(default)
        with shim.cuda.stream(None):
            assert shim.cuda.current_stream() is stream
    assert shim.cuda.current_stream() is default
    for s in (stream, default):  # what DeepSpeed and Megatron call on streams
        assert s.query()
        s.synchronize()
        s.wait_event(s.record_event())
    shim.cuda.synchronize()
    start, end = shim.cuda.Event(enable_timing=True), shim.cuda.Event(enable_timing=True)
    start.record()
    time.sleep(0.01)
    end.record()
    end.wait()
    end.synchronize()
    assert end.query() and 5 < start.elapsed_time(end) < 5000
    with pytest.raises(RuntimeError, match="enable_timing"):
        shim.cuda.Event().elapsed_time(end)


@needs_no_cuda
def test_memory_counters_are_zero(no_env_device):
    for name in ["memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
                 "memory_cached", "max_memory_cached"]:  # fmt: skip
        assert getattr(shim.cuda, name)() == 0, name
    shim.cuda.reset_max_memory_allocated()
    shim.cuda.reset_peak_memory_stats()
    shim.cuda.empty_cache()
    assert shim.cuda.memory_stats() == {}


def test_native_names_when_active_device_is_cuda(monkeypatch):
    monkeypatch.setenv("SHIM_DEVICE", "cuda")
    assert shim.cuda.FloatTensor is torch.cuda.FloatTensor
    assert shim.cuda.manual_seed is torch.cuda.manual_seed
    assert shim.cuda.memory_cached is torch.cuda.memory_reserved  # no deprecation warning
    monkeypatch.setenv("SHIM_DEVICE", "cpu")
    assert shim.cuda.manual_seed is cudaless.manual_seed


def test_other_names_forward_to_torch_cuda():
    assert shim.cuda.amp is torch.cuda.amp
    assert shim.cuda.get_device_name is torch.cuda.get_device_name
    assert set(cudaless.__all__) <= set(dir(shim.cuda))
    assert "memory_cached" in dir(shim.cuda)
    assert importlib.import_module("shim.cuda.amp") is torch.cuda.amp
    from shim.cuda.amp import GradScaler

    assert GradScaler is torch.cuda.amp.GradScaler
    assert shim.cuda.__file__ != torch.cuda.__file__
