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


WRAPPER = """\
import torch


class FP16_Module(torch.nn.Module):
    def __init__(self, module):
        super().__init__()
        self.add_module('module', module)

    def state_dict(self, destination=None, prefix='', keep_vars=False):
        return self.module.state_dict(destination, prefix, keep_vars)
"""


def test_positional_state_dict_call_of_a_wrapper_runs_without_the_deprecation(migrate):
    """fp16/fp16.py, model/distributed.py and model/downstream.py forward ``state_dict(destination, prefix,
    keep_vars)`` by position, which today's torch warns about (FutureWarning: keywords are to be enforced):
    the migrated wrapper passes them by keyword, and the same dict comes back without a warning."""
    import warnings

    import torch

    text, report = migrate(WRAPPER)
    assert "        return self.module.state_dict(destination=destination, prefix=prefix, keep_vars=keep_vars)" \
        in text.splitlines()
    assert [c["code"] for c in report.changes].count("TRC004") == 1
    namespace: dict = {}
    exec(compile(text, "case.py", "exec"), namespace)
    wrapped = namespace["FP16_Module"](torch.nn.Linear(2, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        sd = wrapped.state_dict(None, "m.", True)
    assert list(sd) == ["m.weight", "m.bias"] and sd["m.weight"].requires_grad


def test_state_dict_calls_that_may_not_be_a_module_s_are_left_and_reported(migrate):
    """Where the file defines a ``state_dict`` with other positional parameters the call may reach, or
    the call passes more positional arguments than nn.Module.state_dict takes, or ``*args``: left as
    they are, each reported with its line."""
    source = """\
class Tracker:
    def state_dict(self, step, prefix=''):
        return {prefix + 'step': step}


def save(tracker, model, args):
    return tracker.state_dict(3, 'a.'), model.state_dict()
"""
    text, report = migrate(source)
    assert text == source
    assert [(u["line"], u["code"]) for u in report.unconverted] == [(7, "TRC004")]
    assert "line 2 defines state_dict" in report.unconverted[0]["reason"]

    source = "def save(model, args):\n    return model.state_dict({}, '', False, 4), model.state_dict(*args)\n"
    text, report = migrate(source)
    assert text == source
    reasons = [u["reason"] for u in report.unconverted]
    assert len(reasons) == 2 and "4 positional arguments" in reasons[0] and "*args" in reasons[1]
