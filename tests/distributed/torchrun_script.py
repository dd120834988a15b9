"""Run by test_torchrun.py under ``torchrun --nproc_per_node 2``: nothing initialised by hand.

``setup_layout`` starts the process group from the launcher's environment
(env://); a column- then row-parallel pair matches the whole computation; shim's
``destroy_process_group`` then frees the groups (their gloo threads joined) before interpreter shutdown.
"""

import os

import torch

import shim.distributed as dist
from shim.nn import Linear1D

layout = dist.setup_layout(tensor_parallel_size=2)
assert dist.is_initialized() and dist.get_world_size() == 2 and layout.data_parallel_size == 1
torch.manual_seed(0)
reference_up, reference_down = torch.nn.Linear(4, 8), torch.nn.Linear(8, 4)
torch.manual_seed(0)
up, down = Linear1D(4, 8, parallel="col"), Linear1D(8, 4, parallel="row")
x = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
torch.testing.assert_close(down(up(x)), reference_down(reference_up(x)), rtol=1e-5, atol=1e-5)
del up, down
dist.destroy_process_group()
# The groups' gloo threads must not outlive the call into interpreter shutdown (where a thread that
# touches Python is ended inside a noexcept frame: "terminate called without an active exception",
# SIGABRT). The DeviceMesh's tp/pp/dp groups held 6 more threads here before shim let them go; the
# default group alone (one gloo_tcp_loop, two pt_gloo_runloop: idle) stays pinned by torch's DTensor.
threads = [open(f"/proc/self/task/{task}/comm").read().strip() for task in os.listdir("/proc/self/task")]
gloo = sorted(name for name in threads if "gloo" in name)
assert gloo in ([], ["gloo_tcp_loop", "pt_gloo_runloop", "pt_gloo_runloop"]), gloo
assert dist.current_layout() is None
if dist.is_main_process():
    print("torchrun ok")
