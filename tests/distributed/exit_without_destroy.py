"""Run by test_torchrun.py as a plain script: GLM-style code that never destroys its process groups.

A checker registered before the group exists runs after shim's own exit handler (atexit is last in,
first out) and fails the process (exit 3) if a gloo thread is still alive there, i.e. if the groups
would be left for interpreter finalization to free.
"""

import atexit
import os

import torch

import shim.distributed as dist


def gloo_threads_at_exit():
    tasks = os.listdir("/proc/self/task")
    gloo = sorted(n for n in (open(f"/proc/self/task/{t}/comm").read().strip() for t in tasks) if "gloo" in n)
    if gloo:
        print(f"gloo threads alive at exit: {gloo}", flush=True)
        os._exit(3)
    print("no gloo threads at exit", flush=True)


atexit.register(gloo_threads_at_exit)
dist.init_process_group("gloo")  # a world of one: no launcher
tensor = torch.ones(2)
dist.all_reduce(tensor, group=dist.new_group([0]))  # a group only torch keeps, as DeviceMesh's are
dist.all_reduce(tensor)
