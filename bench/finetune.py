"""glm-finetune's training step: samples/s and peak memory, full against LoRA, with and without recompute,
and (ChatGLM2 shapes) P-Tuning v2; and quality: ROUGE-L on the embedded task after N steps, full and LoRA.

    python -m bench.finetune                                   # small CPU shape + GLM-Large at PaddleNLP's shape
    python -m bench.finetune --shapes large --bf16 --steps 10  # on a GPU
    python -m bench.finetune --shapes tiny --steps 2 --quality-steps 5 --no-tracker   # smoke run
    python -m bench.finetune --shapes chatglm2-small --no-quality --rounds 3   # the six variants, ChatGLM2, CPU
    python -m bench.finetune --shapes chatglm2-6b-2l --no-quality --bf16 --steps 10   # on a GPU

Speed rows: each (shape, variant) runs in a fresh process (``bench/_measure.run_worker``), so its peak RSS
is its own. The step is glm-finetune's: the model and the LoRA adapters are built as ``glm_port.finetune.run``
builds them (PEFT, ``--r 8 --lora_alpha 16`` on ``query_key_value``), the optimizer by the shared
``build_optimizer``, the step is the shared ``train_step`` that ``TrainingLoop`` runs, on samples laid out
by ``seq2seq.encode_pair`` at full ``src_length + tgt_length`` (random tokens: speed does not depend on
them). Reported: the median step time after ``--warmup`` steps as samples/s; the process's peak RSS and its
rise over the set-up (model and data built, before the first step: optimizer state, gradients and
activations); and the tensors alive at the peak of one step (torch's ``MemTracker`` on CPU, as
bench/checkpointing.py; ``max_memory_allocated`` on a GPU), measured in a step of its own.

Shapes: ``small`` (6 layers, hidden 512, src 128 / tgt 32, batch 8) for CPU; ``large`` is GLM-Large
(24 layers, hidden 1024, 16 heads, vocabulary 50048 as glm-large-chinese) at PaddleNLP's GLM recipe shape
(``--src_length 608 --tgt_length 160``, batch 2); ``tiny`` is the embedded task's model, for smoke runs.

ChatGLM2 shapes (``chatglm2-*``) run six variants side by side: ``full``, ``full+recompute``, ``lora``,
``lora+recompute``, ``ptuning`` (P-Tuning v2, ``--pre_seq_len`` 128 as THUDM's ptuning/train.sh; the
bench's ``--pre-seq-len``) and ``ptuning+projection`` (``--prefix_projection``). The model is built as
glm-finetune's ChatGLM2 binding builds it: ``attach_prefix`` for P-Tuning (base frozen, prefix encoder in
fp32), PEFT LoRA by ``apply_lora`` with glm-finetune's default flags, recompute by transformers'
``gradient_checkpointing_enable``; the loss through the binding's ``logits``, on samples in ADGEN's layout
(``src`` prompt tokens, ``tgt`` answer tokens and ``</s>`` counted, ``src + tgt + 1`` tokens, random ids).
``chatglm2-6b-2l`` is ChatGLM2-6B's width (hidden 4096, ffn 13696, 32 heads in 2 key/value groups,
vocabulary 65024) with 2 layers, at ADGEN's ``--max_source_length 64 --max_target_length 128``, batch 4;
``chatglm2-small`` the same layout at hidden 512 for CPU; ``chatglm2-tiny`` for smoke runs. A row also
counts the trainable parameters left without a gradient after a step ("no grad"; it must be 0).

``--rounds N`` runs the whole job list N times, round after round (so a slow spell on a shared machine
falls on every variant alike); a row is the median of its rounds.

Quality rows: ``glm-finetune`` itself (the embedded default) with ``--max_steps N``, full and ``--lora``,
in a fresh process each; ROUGE-L (rouge-score, x 100) of beam search before training and after N steps.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench._measure import MIB, current_rss_bytes, peak_rss_bytes, print_cpu_line, run_worker


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    heads: int
    vocab: int
    src: int
    tgt: int
    batch: int
    family: str = "glm"
    ffn: int = 0  # ChatGLM2: the MLP's width
    groups: int = 0  # ChatGLM2: key/value groups (multi-query attention)


SHAPES = {
    "tiny": Shape(2, 128, 4, 30592, 12, 10, 8),
    "small": Shape(6, 512, 8, 30592, 128, 32, 8),
    "large": Shape(24, 1024, 16, 50048, 608, 160, 2),
    "chatglm2-tiny": Shape(2, 128, 4, 1024, 12, 10, 8, "chatglm2", ffn=344, groups=2),
    "chatglm2-small": Shape(2, 512, 8, 65024, 64, 128, 4, "chatglm2", ffn=1712, groups=2),
    "chatglm2-6b-2l": Shape(2, 4096, 32, 65024, 64, 128, 4, "chatglm2", ffn=13696, groups=2),
}
VARIANTS = ("full", "full+recompute", "lora", "lora+recompute", "ptuning", "ptuning+projection")
PTUNING = ("ptuning", "ptuning+projection")  # ChatGLM2 family only (glm-finetune's --pre_seq_len)


def variants_of(shape_name: str, variants) -> list[str]:
    """The variants a shape runs: P-Tuning on ChatGLM2 shapes only (glm-finetune refuses it for GLM)."""
    return [v for v in variants if v not in PTUNING or SHAPES[shape_name].family == "chatglm2"]


# ---- the worker: one (shape, variant) in a fresh process ---------------------------------------------


class _Ids:
    """The command ids encode_pair needs, at the top of the vocabulary (as GLM's tokenizers put them)."""

    def __init__(self, vocab: int):
        self.cls_id, self.gmask_id, self.eos_id, self.sop_id, self.eop_id, self.pad_id = range(vocab - 6, vocab)


def _samples(shape: Shape, count: int, seed: int):
    import numpy as np

    from glm_port.models.glm.seq2seq import encode_pair

    rng = np.random.default_rng(seed)
    ids = _Ids(shape.vocab)
    return [encode_pair(ids, rng.integers(0, shape.vocab - 6, shape.src).tolist(),
                        rng.integers(0, shape.vocab - 6, shape.tgt).tolist(), shape.src, shape.tgt)
            for _ in range(count)]


def _build(shape: Shape, variant: str, device):
    import shim as torch
    from glm_port.finetune.arguments import parse_args
    from glm_port.finetune.run import apply_lora
    from glm_port.models.glm import GLMConfig, GLMModel

    lora, recompute = variant.startswith("lora"), variant.endswith("+recompute")
    config = GLMConfig(vocab_size=shape.vocab, num_layers=shape.layers, hidden_size=shape.hidden,
                       num_attention_heads=shape.heads, max_sequence_length=max(shape.src + shape.tgt, 64),
                       checkpoint_activations=recompute)
    torch.manual_seed(0)
    glm = GLMModel(config).to(device)
    args = parse_args(["--lora"] if lora else [])
    return (apply_lora(args, glm) if lora else glm), args


def chatglm2_flags(variant: str, pre_seq_len: int = 128) -> list[str]:
    """glm-finetune's flags for a variant (ChatGLM2)."""
    flags = ["--lora"] if variant.startswith("lora") else []
    flags += ["--recompute"] if variant.endswith("+recompute") else []
    if variant in PTUNING:
        flags += ["--pre_seq_len", str(pre_seq_len)] + (["--prefix_projection"] if variant.endswith("projection") else [])
    return flags


def _build_chatglm2(shape: Shape, variant: str, device, pre_seq_len: int):
    import shim as torch
    from glm_port.finetune.arguments import parse_args
    from glm_port.finetune.run import apply_lora
    from glm_port.models.chatglm2.config import ChatGLM2Config
    from glm_port.models.chatglm2.model import ChatGLM2ForCausalLM, attach_prefix

    args = parse_args(chatglm2_flags(variant, pre_seq_len))
    config = ChatGLM2Config(num_layers=shape.layers, padded_vocab_size=shape.vocab, hidden_size=shape.hidden,
                            ffn_hidden_size=shape.ffn, kv_channels=shape.hidden // shape.heads,
                            num_attention_heads=shape.heads, multi_query_group_num=shape.groups)
    torch.manual_seed(0)
    model = ChatGLM2ForCausalLM(config).to(device)
    if args.pre_seq_len is not None:  # as the binding's load: the base frozen, a new fp32 prefix encoder
        attach_prefix(model, args.pre_seq_len, args.prefix_projection)
    if args.recompute:  # as the binding's load (transformers' API; its older name before the 5.x rename)
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
    return (apply_lora(args, model) if args.lora else model), args


def _chatglm2_samples(shape: Shape, count: int, seed: int):
    """ADGEN's layout (binding ``encode``): ``src`` prompt tokens, then ``tgt`` answer tokens and ``</s>``, the
    answer and ``</s>`` counted; random ids."""
    import numpy as np

    from glm_port.training import Encoded

    rng = np.random.default_rng(seed)
    length = shape.src + shape.tgt + 1
    samples = []
    for _ in range(count):
        text = rng.integers(5, shape.vocab, length)
        target = np.append(text[1:], 0)
        mask = (np.arange(length) >= shape.src - 1) & (np.arange(length) < length - 1)
        samples.append(Encoded(text=text, position_id=np.arange(length), sep=shape.src,
                               target=np.where(mask, target, 0), loss_mask=mask.astype(np.float32),
                               truncated_target=False))
    return samples


class _Pad:
    pad_token_id = 0


def worker(spec: str, args) -> dict:
    import shim as torch
    from glm_port.models.glm.seq2seq import pad_batch
    from glm_port.training import OptimizerSettings, Precision, build_optimizer, positions_logits, train_step

    shape_name, variant = spec.split(":")
    shape = SHAPES[shape_name]
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device) if args.device else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    logits_fn = positions_logits
    if shape.family == "chatglm2":
        from glm_port.models.chatglm2 import finetune as binding

        model, flags = _build_chatglm2(shape, variant, device, args.pre_seq_len)
        batches = [binding.collate(_chatglm2_samples(shape, shape.batch, seed), _Pad())
                   for seed in range(args.warmup + args.steps + 1)]
        logits_fn = binding.logits
    else:
        model, flags = _build(shape, variant, device)
        batches = [pad_batch(_samples(shape, shape.batch, seed), _Ids(shape.vocab).pad_id)
                   for seed in range(args.warmup + args.steps + 1)]
    batches = [{k: v.to(device) for k, v in b.items()} for b in batches]
    optimizer, scheduler = build_optimizer(model, OptimizerSettings(
        lr=flags.learning_rate, weight_decay=flags.weight_decay, warmup=0.0, decay_iters=1000,
        decay_style=flags.lr_scheduler_type, decay_ratio=0.0))
    precision = Precision(device, torch.bfloat16 if args.bf16 else torch.float32)
    model.train()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())

    def step(batch) -> float:
        loss = train_step(model, [batch], optimizer, scheduler, precision, clip_grad=flags.max_grad_norm,
                          logits_fn=logits_fn)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return loss

    baseline = peak_rss_bytes()
    setup_rss = current_rss_bytes()
    losses, seconds = [], []
    for index, batch in enumerate(batches[:args.warmup + args.steps]):
        start = time.perf_counter()
        losses.append(step(batch))
        if index >= args.warmup:
            seconds.append(time.perf_counter() - start)
    peak = peak_rss_bytes()
    # Every trained weight must get a gradient (recompute around frozen inputs can cut the path to adapters).
    no_grad = sum(p.numel() for p in model.parameters() if p.requires_grad and p.grad is None)
    result = {
        "shape": shape_name, "variant": variant, "trainable": trainable, "total": total, "no_grad": no_grad,
        "step_s": statistics.median(seconds), "first_loss": losses[0], "last_loss": losses[-1],
        "peak_rss_mib": peak / MIB, "rise_rss_mib": (peak - max(baseline, setup_rss)) / MIB,
    }
    result["samples_s"] = shape.batch / result["step_s"]
    result["tokens_s"] = shape.batch * (shape.src + shape.tgt + (shape.family == "chatglm2")) / result["step_s"]
    if not args.no_tracker:
        result["peak_tensor_mib"] = _peak_tensors(step, batches[-1], model, optimizer, device) / MIB
    return result


class _NoHook:
    def remove(self) -> None:
        pass


def _peak_tensors(step, batch, model, optimizer, device) -> int:
    """Bytes of tensors alive at the peak of one step (state already created by the timed steps)."""
    import gc

    import shim as torch

    if device.type == "cuda":
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        step(batch)
        return torch.cuda.max_memory_allocated(device)
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    # MemTracker hooks every parameter's gradient and fails on frozen ones (LoRA's base weights): mark those
    # as hooked already, with handles that remove nothing.
    for parameter in model.parameters():
        if not parameter.requires_grad:
            tracker._param_to_grad_hook_handles[parameter] = (_NoHook(), _NoHook())
    tracker.track_external(model, optimizer)
    with tracker:
        step(batch)
    return int(sum(peaks["Total"] for peaks in tracker.get_tracker_snapshot("peak").values()))


def quality_worker(variant: str, args) -> dict:
    """glm-finetune's embedded default for ``--quality-steps`` steps; ROUGE-L before and after."""
    from glm_port.finetune.run import main

    with tempfile.TemporaryDirectory() as out:
        argv = ["--max_steps", str(args.quality_steps), "--output_dir", out, "--eval_steps", "0",
                "--logging_steps", str(max(args.quality_steps, 1))] + (["--lora"] if variant == "lora" else [])
        log = io.StringIO()
        start = time.perf_counter()
        with contextlib.redirect_stdout(log):
            main(argv)
        seconds = time.perf_counter() - start
        after = json.loads(Path(out, "eval_results.json").read_text())
    before = re.search(r"eval at step 0 \|.*?rouge-l\s+([\d.]+)", log.getvalue())
    return {"variant": variant, "steps": args.quality_steps, "seconds": seconds,
            "rouge_l_before": float(before.group(1)) if before else float("nan"),
            "rouge_l": after["rouge-l"], "rouge_2": after["rouge-2"], "bleu_4": after["bleu-4"]}


# ---- the driver --------------------------------------------------------------------------------------


def _worker_argv(args) -> list[str]:
    argv = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--quality-steps", str(args.quality_steps),
            "--pre-seq-len", str(args.pre_seq_len)]
    argv += ["--threads", str(args.threads)] if args.threads else []
    argv += ["--device", args.device] if args.device else []
    argv += ["--bf16"] if args.bf16 else []
    argv += ["--no-tracker"] if args.no_tracker else []
    return argv


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=["small", "large"])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS),
                        help="(ptuning and ptuning+projection run on the chatglm2-* shapes only)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per variant (default 3)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run the whole job list this many times, round after round; rows are medians (default 1)")
    parser.add_argument("--pre-seq-len", type=int, default=128,
                        help="P-Tuning v2's prefix length (default 128, THUDM ptuning/train.sh's)")
    parser.add_argument("--quality-steps", type=int, default=300,
                        help="glm-finetune steps for the quality rows (default 300, the embedded default's)")
    parser.add_argument("--no-quality", action="store_true", help="skip the quality rows")
    parser.add_argument("--no-tracker", action="store_true", help="skip the peak-tensor step (MemTracker is slow)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (the GPU configuration)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    parser.add_argument("--device", default=None, help="cpu, cuda (default: the GPU if there is one)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for flag in ("steps", "rounds", "pre_seq_len"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    if args.warmup < 0:
        parser.error(f"--warmup must be at least 0, got {args.warmup}")
    if not any(variants_of(name, args.variants) for name in args.shapes):
        parser.error("--variants: P-Tuning runs on the chatglm2-* shapes only; none of --shapes is one")
    return args


def speed_jobs(args) -> list[str]:
    """The speed jobs, ``speed=SHAPE:VARIANT``, round after round."""
    return [f"speed={s}:{v}" for _ in range(args.rounds) for s in args.shapes for v in variants_of(s, args.variants)]


def summarize(results: list[dict]) -> list[dict]:
    """One row per (shape, variant) in first-seen order: each figure the median of its rounds (the first
    round's losses), with ``rounds`` and the samples/s min and max."""
    groups: dict = {}
    for r in results:
        groups.setdefault((r["shape"], r["variant"]), []).append(r)
    rows = []
    for runs in groups.values():
        row = dict(runs[0])
        for key in ("step_s", "samples_s", "tokens_s", "peak_rss_mib", "rise_rss_mib", "peak_tensor_mib"):
            if all(key in r for r in runs):
                row[key] = statistics.median(r[key] for r in runs)
        row["no_grad"] = max(r["no_grad"] for r in runs)
        row["rounds"] = len(runs)
        row["samples_min"], row["samples_max"] = min(r["samples_s"] for r in runs), max(r["samples_s"] for r in runs)
        rows.append(row)
    return rows


def print_speed_table(name: str, rows: list[dict], args) -> None:
    shape = SHAPES[name]
    precision = "bf16 autocast" if args.bf16 else "fp32"
    family = (f"ChatGLM2 layout, ffn {shape.ffn}, {shape.groups} kv groups, P-Tuning pre_seq_len {args.pre_seq_len}, "
              if shape.family == "chatglm2" else "")
    rounds = f"; median of {args.rounds} rounds (samples/s min-max)" if args.rounds > 1 else ""
    print(f"\n{name}: {shape.layers} layers, hidden {shape.hidden}, {shape.heads} heads, vocab {shape.vocab}, "
          f"{family}src {shape.src} + tgt {shape.tgt}, batch {shape.batch}, {precision}, "
          f"median of {args.steps} steps after {args.warmup}{rounds}")
    print("| variant | trainable params | samples/s | s/step | peak RSS MiB | RSS rise MiB | peak tensors MiB |"
          "\n| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        tensors = f"{r['peak_tensor_mib']:.0f}" if "peak_tensor_mib" in r else "-"
        spread = f" ({r['samples_min']:.2f}-{r['samples_max']:.2f})" if r.get("rounds", 1) > 1 else ""
        print(f"| {r['variant']} | {r['trainable']:,} ({100 * r['trainable'] / r['total']:.2f}%) | "
              f"{r['samples_s']:.2f}{spread} | {r['step_s']:.2f} | {r['peak_rss_mib']:.0f} | {r['rise_rss_mib']:.0f} | "
              f"{tensors} |")
    by_variant = {r["variant"]: r for r in rows}
    for base in ("full", "lora"):  # recompute replays the same math: the first loss must not move
        pair = by_variant.get(base), by_variant.get(f"{base}+recompute")
        if all(pair) and abs(pair[0]["first_loss"] - pair[1]["first_loss"]) > 1e-3 * abs(pair[0]["first_loss"]):
            print(f"WARNING: {base} and {base}+recompute disagree on the first loss: "
                  f"{pair[0]['first_loss']} vs {pair[1]['first_loss']}")
    for r in rows:
        if r["no_grad"]:
            print(f"WARNING: {r['variant']}: {r['no_grad']:,} trainable parameters got no gradient")


def main(argv=None) -> None:
    args = parse(argv)

    if args.worker:
        kind, _, spec = args.worker.partition("=")
        result = quality_worker(spec, args) if kind == "quality" else worker(spec, args)
        print(json.dumps(result))
        return

    from tqdm import tqdm

    print_cpu_line()
    module = __spec__.name  # the workers run as `python -m bench.finetune --worker ...`
    jobs = speed_jobs(args)
    jobs += [] if args.no_quality else ["quality=full", "quality=lora"]
    results = [run_worker(module, job, _worker_argv(args)) for job in tqdm(jobs, desc="bench.finetune", leave=False)]
    speed = summarize([r for r in results if "shape" in r])
    quality = [r for r in results if "rouge_l" in r]
    for name in args.shapes:
        rows = [r for r in speed if r["shape"] == name]
        if rows:
            print_speed_table(name, rows, args)
    if quality:
        print("\nquality: glm-finetune's embedded task (reverse a phrase), beam search, ROUGE-L (rouge-score x 100)")
        print("| variant | steps | ROUGE-L before | ROUGE-L after | ROUGE-2 | BLEU-4 | wall s |\n"
              "| --- | --- | --- | --- | --- | --- | --- |")
        for r in quality:
            print(f"| {r['variant']} | {r['steps']} | {r['rouge_l_before']:.2f} | {r['rouge_l']:.2f} | "
                  f"{r['rouge_2']:.2f} | {r['bleu_4']:.2f} | {r['seconds']:.0f} |")


if __name__ == "__main__":
    main()
