"""What the decode benches (bench.chatglm2, bench.generate) share for a device: synchronising it, its copy
rate (the memory-bandwidth bound's denominator), and the ``compiled`` variant's ``generate`` keywords."""

from __future__ import annotations

import statistics
import time


def sync(device) -> None:
    """Wait for the device's queued work (a no-op on the CPU)."""
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def copy_rate(device, size: int = 2**30) -> float:
    """The device's copy rate in bytes/s, counting read + write: the median of 5 timed copies of ``size``
    bytes (after one untimed). 100% of a decode bound is a step that only streams its weights at this rate."""
    import torch

    source = torch.empty(size, dtype=torch.uint8, device=device).fill_(1)
    target = torch.empty_like(source)
    times = []
    for _ in range(6):
        sync(device)
        start = time.perf_counter()
        target.copy_(source)
        sync(device)
        times.append(time.perf_counter() - start)
    del source, target
    return 2 * size / statistics.median(times[1:])


def weight_bytes_per_step(model) -> int:
    """Bytes of weights one decode step reads: every parameter but the input embedding table (of which a step
    reads one row per sequence). A tied output layer is the embedding table and is read whole: counted once."""
    embedding = model.get_input_embeddings().weight
    output = model.get_output_embeddings()
    tied = output is not None and output.weight is embedding
    return sum(p.numel() * p.element_size() for p in model.parameters() if tied or p is not embedding)


def compile_kwargs(device) -> dict:
    """``generate`` keywords of the ``compiled`` variants, as gpt-fast decodes: a static cache and the decode
    step compiled (``mode="reduce-overhead"``: CUDA graphs on a GPU; inductor's default on the CPU)."""
    from transformers import CompileConfig

    config = CompileConfig(fullgraph=True, dynamic=False,
                           mode="reduce-overhead" if str(device).startswith("cuda") else "default")
    config._compile_all_devices = True  # transformers compiles on accelerators only unless told (the CPU too)
    return {"cache_implementation": "static", "compile_config": config}
