"""Run an unmodified Megatron-LM script under glm-mock on a machine without CUDA.

``python megatron_reference.py SCRIPT ARGS...`` in the tree's directory. glm-mock serves apex, amp_C
and Megatron's CUDA extensions from the rule tables, but cannot edit the tree's own code; the two
edits glm-migrate makes there (MEG005, MEG006) are made here for the reference run, at run time:
``initialize_megatron(allow_no_cuda=True)`` and ``fused_kernels.load`` compiling nothing. NumPy's
removed aliases (``np.float``), which glm-mock does not serve, are put back from the NPY rules.
"""

import builtins
import functools
import runpy
import sys

import numpy

from migrate.rules import load_rules

for _rule in load_rules():
    if _rule.match.startswith("numpy.") and _rule.kind == "symbol" and not hasattr(numpy, _rule.match[6:]):
        _module, _, _name = _rule.target.rpartition(".")
        setattr(numpy, _rule.match[6:], getattr(builtins if _module == "builtins" else numpy, _name))

sys.path.insert(0, ".")

import megatron.fused_kernels  # noqa: E402
import megatron.initialize  # noqa: E402

megatron.initialize.initialize_megatron = functools.partial(megatron.initialize.initialize_megatron,
                                                            allow_no_cuda=True)
megatron.fused_kernels.load = lambda args: None

script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
