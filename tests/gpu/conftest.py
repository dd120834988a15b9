"""The ``gpu`` tests: the CUDA paths, run where CUDA is present and skipped (with that reason) elsewhere.

``GLM_GPU_TESTS_DEVICE=cpu`` runs them on the CPU instead: a rehearsal of the same code before a GPU is at
hand (bench/gpu.py runs them on the GPU as part of its one prepared run).
"""

import os

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available() or os.environ.get("GLM_GPU_TESTS_DEVICE"):
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (GLM_GPU_TESTS_DEVICE=cpu rehearses these on the CPU)")
    for item in items:
        # The marker itself, not a keyword: "gpu" is also a parameter id elsewhere (bench.gpu in the bench tests).
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def device():
    return torch.device(os.environ.get("GLM_GPU_TESTS_DEVICE") or "cuda")
