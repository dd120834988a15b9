"""What each speed lever buys glm_port's training step, added one at a time from upstream's math.

    python -m bench.pretrain_levers                 # CPU shapes tiny and base, fp32
    python -m bench.pretrain_levers --shapes large --bf16 --batch-size 8    # on a GPU
    python -m bench.pretrain_levers --shapes base --profile                 # and where the time goes now

Row 0 is glm_port computing what upstream computes, the way upstream computes it: explicit masked
attention, bias + GELU and bias + dropout + residual as separate ops, ``F.cross_entropy`` on fp32
logits of every position, foreach AdamW. Each later row adds one lever to the row above. Steps run in
this process on real blank-infilling batches (upstream's test corpus or ``--corpus``, BERT WordPiece
from ``--vocab`` or ``$GLM_VOCAB``, bert_prob 1.0,
dropout 0.1), the same batches for every row; the figure is the median step time after ``--warmup``.
Rows alternate over ``--rounds`` and the median over rounds is reported, for loaded machines.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import statistics
import tempfile
import time
from dataclasses import dataclass

from tqdm import tqdm

import shim as torch
import shim.nn.functional as F
from glm_port import GLMConfig, GLMModel, data
from glm_port.pretrain_glm import compile_mode_by_default
from glm_port.training import OptimizerSettings, Precision, build_optimizer, lm_loss
from bench._measure import print_cpu_line
from bench.pretrain import SHAPES, add_data_arguments, corpus_for, resolve_data


@dataclass(frozen=True)
class Levers:
    attention: str = "explicit"  # GLMConfig.attention_impl
    fused_elementwise: bool = False
    fused_cross_entropy: bool = False
    fused_adamw: bool = False
    loss_positions_only: bool = False


STEPS = [
    ("0. upstream's math (explicit attention, composed ops, fp32 CE, foreach AdamW)", Levers()),
    ("1. + SDPA with the sep mask", Levers("sdpa")),
    ("2. + fused bias+GELU, bias+dropout+residual", Levers("sdpa", fused_elementwise=True)),
    ("3. + sparse_softmax_cross_entropy (one logits-sized buffer)",
     Levers("sdpa", fused_elementwise=True, fused_cross_entropy=True)),
    ("4. + fused AdamW", Levers("sdpa", fused_elementwise=True, fused_cross_entropy=True, fused_adamw=True)),
    ("5. + logits only where the loss counts", Levers("sdpa", True, True, True, True)),
    ("6. + fused_masked_attention: CPU kernel with dropout, SDPA on CUDA (glm-pretrain)",
     Levers("fused", True, True, True, True)),
]  # fmt: skip


def _composed_bias_gelu(x, bias, approximate="tanh"):
    return F.gelu(x + bias, approximate=approximate)


def _composed_bias_dropout(x, bias, p, training=True, residual=None):
    out = F.dropout(x + bias, p, training)
    return out if residual is None else out + residual


@contextlib.contextmanager
def composed_elementwise():
    """shim's fused bias ops swapped for the composed forms upstream writes, for the duration."""
    saved = F.fused_bias_add_gelu, F.fused_bias_add_dropout
    F.fused_bias_add_gelu, F.fused_bias_add_dropout = _composed_bias_gelu, _composed_bias_dropout
    try:
        yield
    finally:
        F.fused_bias_add_gelu, F.fused_bias_add_dropout = saved


def full_logits_loss(model, batch, fused_cross_entropy: bool):
    """Upstream's order: logits for every position, per-position loss, then the mask."""
    logits, *_ = model(batch["text"], batch["position_id"], batch["attention_mask"])
    if fused_cross_entropy:
        losses = F.sparse_softmax_cross_entropy(logits, batch["target"])
    else:
        losses = F.cross_entropy(logits.float().flatten(0, 1), batch["target"].flatten(), reduction="none")
    mask = batch["loss_mask"].flatten()
    return (losses.flatten() * mask).sum() / mask.sum()


def step(model, batch, optimizer, precision, levers: Levers) -> float:
    optimizer.zero_grad(set_to_none=True)
    with precision.autocast():
        if levers.loss_positions_only:
            loss, _ = lm_loss(model, batch)
        else:
            loss = full_logits_loss(model, batch, levers.fused_cross_entropy)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()


def prepare(config, levers: Levers, device, dtype, compile_layers: bool = False):
    """(model, optimizer, precision) for ``levers``, seeded alike for every row. ``compile_layers``: each
    transformer layer through ``torch.compile`` (``nn.Module.compile``, parameter names unchanged)."""
    torch.manual_seed(0)
    model = GLMModel(config.replace(attention_impl=levers.attention)).to(device).train()
    if compile_layers:
        model.transformer.compile_layers(mode=compile_mode_by_default(device))  # as glm-pretrain compiles
    optimizer, _ = build_optimizer(model, OptimizerSettings(lr=1e-4, warmup=0.0, decay_iters=10**6))
    for group in optimizer.param_groups:
        group["fused"], group["foreach"] = (True, False) if levers.fused_adamw else (False, True)
    return model, optimizer, Precision(device, dtype)


def real_batches(corpus, tokenizer, shape, batch_size: int, count: int, device) -> list[dict]:
    """The first ``count`` blank-infilling batches of ``corpus``, as glm-pretrain draws them."""
    stream = data.build_train_batches([corpus], tokenizer, seq_length=shape.seq, batch_size=batch_size,
                                      seed=1234, masker_kwargs={"bert_prob": 1.0})  # fmt: skip
    return [{k: v.to(device) for k, v in next(stream).items()} for _ in range(count)]


def step_setup(args):
    """(device, dtype, tokenizer) from the common flags (--threads, --bf16, --vocab, --corpus: see
    bench.pretrain.resolve_data); prints the run's line. ``args.corpus`` is written if not given."""
    device = torch.device()
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    args.corpus = corpus_for(args, tempfile.mkdtemp(prefix="glm-bench-corpus-"))
    tokenizer = data.get_tokenizer("BertWordPieceTokenizer", str(args.vocab))
    print(f"{device}, {dtype}, {torch.get_num_threads()} thread(s); median of {args.steps} steps after "
          f"{args.warmup}, {args.rounds} round(s)")  # fmt: skip
    return device, dtype, tokenizer


def shape_setup(name: str, args, tokenizer, device):
    """(shape, batch size, GLMConfig, the real batches every row steps through) for ``--shapes`` entry ``name``."""
    shape = SHAPES[name]
    batch_size = args.batch_size or shape.batches[0]
    config = GLMConfig(vocab_size=tokenizer.vocab_size, num_layers=shape.layers, hidden_size=shape.hidden,
                       num_attention_heads=shape.heads, max_sequence_length=shape.seq)  # fmt: skip
    return shape, batch_size, config, real_batches(args.corpus, tokenizer, shape, batch_size, args.warmup + args.steps, device)


def time_levers(config, batches, levers: Levers, device, dtype, steps: int, warmup: int, profiler=None,
                compile_layers: bool = False) -> tuple[float, float]:
    """(median seconds per step after ``warmup``, seconds of the first step); ``profiler`` (torch.profiler)
    records the timed steps only; with ``compile_layers`` the first step includes the compilation."""
    model, optimizer, precision = prepare(config, levers, device, dtype, compile_layers)
    times = []
    with contextlib.nullcontext() if levers.fused_elementwise else composed_elementwise():
        for i, batch in zip(range(warmup + steps), batches):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if profiler is not None and i == warmup:
                profiler.start()
            start = time.perf_counter()
            torch.compiler.cudagraph_mark_step_begin()  # a new step for layers replayed as CUDA graphs
            step(model, batch, optimizer, precision, levers)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
    if profiler is not None:
        profiler.stop()
    return statistics.median(times[warmup:]), times[0]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=["tiny", "base"])
    parser.add_argument("--batch-size", type=int, help="override the shapes' (first) batch size")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per row and round (default 4)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    parser.add_argument("--rounds", type=int, default=1, help="alternating repetitions (default 1)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (the GPU configuration)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU (default 1, as bench/pretrain.py)")
    parser.add_argument("--rows", type=int, nargs="+", choices=range(len(STEPS)), default=list(range(len(STEPS))),
                        help="the rows to time (default all); ratios are against the first one")
    add_data_arguments(parser)
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile each transformer layer in every row; prints the first step's time too")
    parser.add_argument("--profile", action="store_true",
                        help="then profile glm-pretrain's step (the last row) with torch.profiler: top ops")
    args = parser.parse_args(argv)
    resolve_data(parser, args)

    print_cpu_line()
    device, dtype, tokenizer = step_setup(args)
    for name in args.shapes:
        shape, batch_size, config, batches = shape_setup(name, args, tokenizer, device)
        counted = sum(b["loss_mask"].sum().item() for b in batches) / sum(b["loss_mask"].numel() for b in batches)
        rows = [STEPS[i] for i in sorted(set(args.rows))]
        seconds = {label: [] for label, _ in rows}
        first_steps = {label: [] for label, _ in rows}
        jobs = [(r, rows[(i + r) % len(rows)]) for r in range(args.rounds) for i in range(len(rows))]
        for _, (label, levers) in tqdm(jobs, desc=name, unit="row", leave=False):
            median, first = time_levers(config, itertools.cycle(batches), levers, device, dtype, args.steps,
                                        args.warmup, compile_layers=args.compile)  # fmt: skip
            seconds[label].append(median)
            first_steps[label].append(first)
        tokens = batch_size * shape.seq
        print(f"\n{name}: {shape.layers} layers, hidden {shape.hidden}, seq {shape.seq}, batch {batch_size}; "
              f"the loss counts {counted:.0%} of the positions"
              f"{'; layers compiled with torch.compile' if args.compile else ''}")  # fmt: skip
        print(f"| lever | ms/step | tokens/s | vs row {rows[0][0].split('.')[0]} | first step s |\n"
              f"| --- | --- | --- | --- | --- |")
        base = statistics.median(seconds[rows[0][0]])
        for label, _ in rows:
            s = statistics.median(seconds[label])
            first = statistics.median(first_steps[label])
            print(f"| {label} | {s * 1e3:.1f} | {tokens / s:.0f} | {base / s:.2f}x | {first:.1f} |")
        if args.profile:
            activities = [torch.profiler.ProfilerActivity.CPU]
            activities += [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []
            profiler = torch.profiler.profile(activities=activities)
            time_levers(config, itertools.cycle(batches), STEPS[-1][1], device, dtype, args.steps, args.warmup,
                        profiler, compile_layers=args.compile)  # fmt: skip
            key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
            print(profiler.key_averages().table(sort_by=key, row_limit=25))


if __name__ == "__main__":
    main()
