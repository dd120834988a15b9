"""Training-step speed of glm_port's GLM: SDPA vs upstream's explicit masked attention, fused vs foreach AdamW.

First the attention alone (forward + backward with GLM's sep mask), then whole training steps.

    python bench/glm_port_step.py                  # small GLM on the active device (shim.device())
    python bench/glm_port_step.py --hidden-size 1024 --num-layers 24 --seq-length 512 --batch-size 4   # GLM-Large

Each variant trains on the same synthetic blank-infilling batches (the shapes of glm_port.data);
the variants take turns step by step; the table reports each one's median step time over ``--steps``
after ``--warmup`` steps, and tokens/s.
On a shared machine run it a few times: the medians move with the load.
"""

from __future__ import annotations

import argparse
import statistics
import time

import shim as torch
from glm_port import GLMConfig, GLMModel
from glm_port.attention import ATTENTION_IMPLS, visibility_mask
from glm_port.training import OptimizerSettings, Precision, build_optimizer, train_step


def synthetic_batch(batch: int, seq: int, vocab: int, device) -> dict:
    g = torch.Generator().manual_seed(0)
    sep = torch.randint(seq // 2, seq - 1, (batch,), generator=g)
    columns = torch.arange(seq).expand(batch, seq)
    batch = {
        "text": torch.randint(0, vocab, (batch, seq), generator=g),
        "target": torch.randint(0, vocab, (batch, seq), generator=g),
        "loss_mask": (columns >= sep[:, None]).float(),
        "attention_mask": sep,
        "position_id": torch.stack([columns, (columns - sep[:, None] + 1).clamp(min=0)], dim=1),
    }
    return {k: v.to(device) for k, v in batch.items()}


def _synchronize(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_attention(impl, batch: int, heads: int, seq: int, head_dim: int, device, steps: int, warmup: int,
                   dtype) -> float:
    sep = torch.randint(seq // 4, seq, (batch,), generator=torch.Generator().manual_seed(0)).to(device)
    visible = visibility_mask(sep, batch, seq)
    times = []
    for step in range(warmup + steps):
        q, k, v = (torch.randn(batch, heads, seq, head_dim, device=device, dtype=dtype, requires_grad=True)
                   for _ in range(3))
        _synchronize(device)
        start = time.perf_counter()
        ATTENTION_IMPLS[impl](q, k, v, visible).sum().backward()
        _synchronize(device)
        if step >= warmup:
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def build(config: GLMConfig, device, fused: bool, dtype):
    torch.manual_seed(0)
    model = GLMModel(config).to(device)
    optimizer, scheduler = build_optimizer(model, OptimizerSettings(lr=1e-4, warmup=0.0, decay_iters=10**6))
    if not fused:
        for group in optimizer.param_groups:
            group["fused"], group["foreach"] = False, True
    return model, optimizer, scheduler, Precision(device, dtype)


def time_steps(runs: list, batch: dict, device, steps: int, warmup: int) -> list[float]:
    """Median step time of each run; the runs take turns step by step, so load drifts hit all alike."""
    times = [[] for _ in runs]
    for step in range(warmup + steps):
        for run, run_times in zip(runs, times):
            _synchronize(device)
            start = time.perf_counter()
            model, optimizer, scheduler, precision = run
            train_step(model, [batch], optimizer, scheduler, precision)
            _synchronize(device)
            if step >= warmup:
                run_times.append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--num-attention-heads", type=int, default=4)
    parser.add_argument("--seq-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--vocab-size", type=int, default=30592)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args()

    device = torch.device()
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    base = GLMConfig(vocab_size=args.vocab_size, num_layers=args.num_layers, hidden_size=args.hidden_size,
                     num_attention_heads=args.num_attention_heads, max_sequence_length=args.seq_length)
    batch = synthetic_batch(args.batch_size, args.seq_length, args.vocab_size, device)
    tokens = args.batch_size * args.seq_length
    print(f"attention forward+backward, sep mask, {args.num_attention_heads} heads, "
          f"head dim {args.hidden_size // args.num_attention_heads}")
    explicit = None
    for impl in ("explicit", "sdpa"):
        seconds = time_attention(impl, args.batch_size, args.num_attention_heads, args.seq_length,
                                 args.hidden_size // args.num_attention_heads, device, args.steps, args.warmup,
                                 dtype)
        explicit = explicit or seconds
        print(f"  {impl:<50} {seconds * 1e3:9.1f} ms   x{explicit / seconds:.2f}")
    variants = [
        ("explicit attention, foreach AdamW (upstream's math)", "explicit", False),
        ("explicit attention, fused AdamW", "explicit", True),
        ("SDPA, fused AdamW (glm-pretrain)", "sdpa", True),
    ]
    print(f"device {device}, {dtype}, layers {args.num_layers}, hidden {args.hidden_size}, "
          f"seq {args.seq_length}, batch {args.batch_size}, vocab {args.vocab_size}")
    print(f"{'variant':<52} {'ms/step':>9} {'tokens/s':>10}")
    runs = [build(base.replace(attention_impl=attention), device, fused, dtype) for _, attention, fused in variants]
    medians = time_steps(runs, batch, device, args.steps, args.warmup)
    for (name, _, _), seconds in zip(variants, medians):
        print(f"{name:<52} {seconds * 1e3:9.1f} {tokens / seconds:10.0f}   x{medians[0] / seconds:.2f}")


if __name__ == "__main__":
    main()
