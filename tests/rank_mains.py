"""Run under torchrun by ``tests/conftest.py``'s ``torchrun_mains``: one rank. Starts the gloo process group
(one thread), then calls ``target(argv)`` for each argv of the JSON spec, writing what each call printed
beside the spec as ``rank{RANK}_{index}.txt`` (a call that raised: ``FAILED`` and its traceback)."""

import contextlib
import importlib
import io
import json
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist


def main(spec_path: str) -> None:
    spec = Path(spec_path)
    job = json.loads(spec.read_text())
    module, _, name = job["target"].partition(":")
    target = getattr(importlib.import_module(module), name)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for index, argv in enumerate(job["runs"]):
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out):
                target(argv)
        except BaseException:  # SystemExit too: a refusal is a failed run here
            out.write("FAILED\n" + traceback.format_exc())
        (spec.parent / f"rank{rank}_{index}.txt").write_text(out.getvalue())
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
