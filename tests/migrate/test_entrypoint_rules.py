"""Rules the runs of upstream's other entry points revealed (finetune_glm.py, generate_samples.py...)."""

from __future__ import annotations

SAMPLES = """\
import torch


def generate_samples(model, tokenizer, device):
    return device


def other(x):
    return x


def main():
    generate_samples(None, None, torch.cuda.current_device())
    other(torch.cuda.current_device())
    torch.cuda.set_device(torch.cuda.current_device())


def shadowed():
    def generate_samples(a, b, device):
        return device
    generate_samples(1, 2, torch.cuda.current_device())
"""


def test_current_device_passed_to_a_device_parameter_positionally_becomes_the_active_device(migrate):
    """generate_samples.py passes ``torch.cuda.current_device()`` (a CUDA index) as its own function's
    ``device`` parameter, which ``.to(device)``s the tokens: without CUDA that is an error."""
    text, report = migrate(SAMPLES)
    lines = text.splitlines()
    assert "    generate_samples(None, None, torch.device())" in lines
    assert "    other(torch.cuda.current_device())" in lines  # its parameter is not `device`
    assert "    torch.cuda.set_device(torch.cuda.current_device())" in lines  # not the module's own function
    assert "    generate_samples(1, 2, torch.cuda.current_device())" in lines  # a local def of that name
    assert [c["code"] for c in report.changes].count("CUD005") == 1


CHECKPOINTING = """\
import torch

cuda_device = None


def forward(args):
    global cuda_device
    if cuda_device is None:
        cuda_device = torch.cuda.current_device()
        stream = torch.cuda.Stream(device=cuda_device)
    idx = torch.cuda.current_device()
    return [a.to(cuda_device) for a in args], idx
"""


def test_current_device_assigned_to_cuda_device_becomes_the_active_device(migrate):
    """mpu/random.py's activation checkpointing keeps ``cuda_device = torch.cuda.current_device()``
    and moves its inputs ``.to(cuda_device)``: finetune_glm.py --checkpoint-activations without CUDA."""
    text, report = migrate(CHECKPOINTING)
    assert "        cuda_device = torch.device()" in text.splitlines()
    assert "    idx = torch.cuda.current_device()" in text.splitlines()  # an index, used as one
    namespace: dict = {}
    exec(compile(text, "case.py", "exec"), namespace)
    import torch

    moved, _ = namespace["forward"]([torch.ones(1)])
    assert moved[0].device.type == "cpu"
