"""ChatGLM2 decoding with weight-only int8 / int4 (``shim.nn.quantize_linears``) against the project's packed
fp32 / bf16 path and chatglm-cpp's q8_0 / q4_0, same random weights (bench.chatglm2's seed and shapes).

A first process writes the seeded weights as the variant stores them (safetensors, once per variant); then
each (variant, batch) runs in a fresh process, which imports what it needs and times the load (the file
is in the page cache): the model built on the meta device,
the file read and assigned (``load_state_dict(assign=True)``), the weights packed for the CPU. No variant
quantizes at load: int8/int4 load the quantized tensors as saved (``pack=False`` layout, then
``pack_quantized``).

  fp32, bf16     the model in that dtype, ``shim.nn.pack_linears`` for the run's batch (as glm-chat runs)
  int8, int4     the model in bf16 (activations bf16), every linear quantized, the output layer included
                 (``--keep-output``: it stays bf16, packed), int4 at ``--group-size`` (default 128)
  cpp_q8_0/q4_0  chatglm-cpp (PyPI ``chatglm-cpp``) on its own ``-t q8_0|q4_0`` conversion of the same
                 weights; needs CHATGLM_CPP_PYTHON and CHATGLM2_CODE as bench.chatglm2 documents; batch 1

Columns: load s (read + assign + pack; chatglm-cpp: its Pipeline reading the GGML file), file MiB (the
saved weights), load RSS MiB (the process's resident memory gained by loading: safetensors maps the file,
so weights the packing did not copy come in on first use), RSS end MiB (the whole process after the run,
Python and torch included), ttft ms, decode tok/s
(batch x (new_tokens - 1) / time from the first token to the last), same tokens (row 0's greedy tokens
equal to fp32's at that batch), and the decode ratio to bf16 packed and to chatglm-cpp at the same bits.

    python -m bench.quantized                                  # 4 layers at ChatGLM2-6B width, prompt 512, 128 new
    python -m bench.quantized --layers 1 --new-tokens 8 --prompt 64 --batches 1   # smoke run
    python -m bench.quantized --products                       # one layer's products: kernels (and torchao's)
    python -m bench.quantized --profile int8 --prompt 512      # torch.profiler over int8's decode steps
    python -m bench.quantized --variants bf16 int8 int4 --batches 1 --rounds 3   # interleaved rounds, shared machine
    CHATGLM2_CODE=/dir CHATGLM_CPP_PYTHON=/venv/bin/python python -m bench.quantized   # + chatglm-cpp rows

``--products`` times one decode step's products on ChatGLM2-6B's weight shapes (bench.packed_linear's),
bf16 activations: oneDNN-packed bf16, torch's int8 and int4 CPU kernels (as ``Int8Linear`` /
``Int4Linear`` call them), and torchao's weight-only configs where torchao imports (``pip install
torchao``; not a project dependency).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._measure import print_cpu_line
from bench.chatglm2 import (
    add_shape_arguments,
    ROOT,
    THUDM_FILES,
    cpp_worker,
    decode_rate,
    greedy,
    model_config,
    reset_peak_rss,
    resolve,
    seeded,
    status_kib,
)

OURS = ("fp32", "bf16", "int8", "int4")
CPP = {"cpp_q8_0": "q8_0", "cpp_q4_0": "q4_0"}
SAME_BITS = {"int8": "cpp_q8_0", "int4": "cpp_q4_0"}


def _dtype(variant: str):
    import torch

    return torch.float32 if variant == "fp32" else torch.bfloat16


def _output_skip(args) -> list[str]:
    return ["*output_layer"] if args.keep_output else []


def prepare(variant: str, args, path: Path) -> None:
    """The seeded weights as ``variant`` stores them, written to ``path`` (safetensors)."""
    from safetensors.torch import save_file

    from shim.nn import quantize_linears

    model = seeded(args).to(_dtype(variant))
    if variant in ("int8", "int4"):
        quantize_linears(model, 8 if variant == "int8" else 4, group_size=args.group_size,
                         skip=_output_skip(args), pack=False)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))


def load(variant: str, args, path: Path, batch: int):
    """Build on meta, read ``path``, assign, pack: the model ready to decode (the timed load)."""
    import torch
    from safetensors.torch import load_file

    from glm_port.models.chatglm2 import ChatGLM2ForCausalLM
    from shim.nn import pack_linears, pack_quantized, quantize_linears

    with torch.device("meta"):
        model = ChatGLM2ForCausalLM(model_config(args)).to(_dtype(variant))
        if variant in ("int8", "int4"):
            quantize_linears(model, 8 if variant == "int8" else 4, group_size=args.group_size,
                             skip=_output_skip(args), pack=False)
    model.load_state_dict(load_file(str(path)), assign=True)
    pack_quantized(model)
    pack_linears(model, batch_size=batch)  # fp32/bf16 linears (and a kept output layer)
    return model.eval()


def worker(variant: str, batch: int, path: str, args) -> dict:
    import safetensors.torch  # noqa: F401  (imported before the timed load, as everything it uses)
    import torch

    import glm_port.models.chatglm2  # noqa: F401
    import shim.nn  # noqa: F401

    torch.set_num_threads(args.threads or torch.get_num_threads())
    load_start = os.getloadavg()[0]
    path = Path(path)
    rss_before, start = status_kib("VmRSS") * 1024, time.perf_counter()
    model = load(variant, args, path, batch)
    load_s, load_rss = time.perf_counter() - start, status_kib("VmRSS") * 1024 - rss_before
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, args.vocab, (batch, args.prompt), generator=generator)
    greedy(variant, model, prompt[:, :16], 2)  # warm up code paths
    ttfts = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        greedy(variant, model, prompt, 1)
        ttfts.append(time.perf_counter() - start)
    reset_peak_rss()
    clock = {}
    tokens = greedy(variant, model, prompt, args.new_tokens, clock)
    decode = time.perf_counter() - clock["first"]
    return {
        "variant": variant, "batch": batch, "load_s": load_s, "load_rss_mib": load_rss / 2**20,
        "file_mib": path.stat().st_size / 2**20, "ttft_ms": 1e3 * sorted(ttfts)[len(ttfts) // 2],
        "decode_tok_s": decode_rate(batch * (args.new_tokens - 1), decode), "tokens": tokens[0].tolist(),
        "rss_end_mib": status_kib("VmRSS") / 1024,  # the whole process after the run: every weight page touched
        "load_avg": [load_start, os.getloadavg()[0]],  # the machine's 1-minute load average at start and end
    }


# ------------------------------------------------------------------------------------------ products


def products(args) -> None:
    """One decode step's products on ChatGLM2-6B's shapes, bf16 activations: ms per step (GB/s of weights)."""
    import torch
    import torch.nn.functional as F

    from bench.packed_linear import SHAPES, median_ms
    from shim.nn.quantized import Int4Linear, Int8Linear

    try:
        import torchao  # noqa: F401
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
    except Exception as error:  # absent, or built for another torch
        torchao_missing = f"{type(error).__name__}: {str(error).splitlines()[0][:80]}"
    else:
        torchao_missing = None
    ways = ["bf16 oneDNN-packed", "int8 torch kernel", f"int4 g{args.group_size} torch kernel", "int8 torchao"]
    print(f"{'round':>5} {'rows':>4} " + " ".join(f"{w:>24}" for w in ways)
          + f" {'int8/bf16':>9} {'int4/bf16':>9} {'load avg':>9}")
    ratios = {}  # rows -> [(int8 speed-up, int4 speed-up) per round]
    for round_ in range(args.rounds):
        for rows in args.batches:
            load_start = os.getloadavg()[0]
            totals = dict.fromkeys(ways, 0.0)
            weight_bytes = {w: 0 for w in ways}
            for out_features, in_features in SHAPES.values():
                linear = torch.nn.Linear(in_features, out_features, bias=False).to(torch.bfloat16)
                x = torch.randn(rows, in_features).to(torch.bfloat16)
                with torch.inference_mode():
                    packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), rows)
                    totals[ways[0]] += median_ms(
                        lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [None], ""), args.repeats)
                    weight_bytes[ways[0]] += linear.weight.nbytes
                    del packed
                    int8 = Int8Linear.from_linear(linear)
                    totals[ways[1]] += median_ms(lambda: int8(x), args.repeats)
                    weight_bytes[ways[1]] += int8.weight.nbytes
                    del int8
                    int4 = Int4Linear.from_linear(linear, args.group_size).pack()
                    totals[ways[2]] += median_ms(lambda: int4(x), args.repeats)
                    weight_bytes[ways[2]] += out_features * in_features // 2
                    del int4
                    if torchao_missing is None:
                        ao = torch.nn.Sequential(linear)
                        quantize_(ao, Int8WeightOnlyConfig())
                        totals[ways[3]] += median_ms(lambda: ao(x), args.repeats)
                        weight_bytes[ways[3]] += out_features * in_features
                        del ao
                del linear
            cells = []
            for way in ways:
                if way == ways[3] and torchao_missing:
                    cells.append("n/a")
                else:
                    cells.append(f"{totals[way]:8.1f} ({weight_bytes[way] / totals[way] / 1e6:5.1f})")
            speedups = (totals[ways[0]] / totals[ways[1]], totals[ways[0]] / totals[ways[2]])
            ratios.setdefault(rows, []).append(speedups)
            load = f"{load_start:.1f}-{os.getloadavg()[0]:.1f}"
            print(f"{round_ + 1:>5} {rows:>4} " + " ".join(f"{c:>24}" for c in cells)
                  + f" {speedups[0]:>8.2f}x {speedups[1]:>8.2f}x {load:>9}", flush=True)
    if args.rounds > 1:
        import statistics

        for rows, pairs in ratios.items():
            int8, int4 = ([p[i] for p in pairs] for i in (0, 1))
            print(f"rows {rows}: over {len(pairs)} rounds, int8 {statistics.median(int8):.2f}x "
                  f"({min(int8):.2f}-{max(int8):.2f}), int4 {statistics.median(int4):.2f}x "
                  f"({min(int4):.2f}-{max(int4):.2f}) bf16 packed's speed")
    if torchao_missing:
        print(f"torchao: not measured ({torchao_missing})")


def profile_decode(variant: str, args) -> None:
    """torch.profiler over ``--profile-steps`` decode steps at batch 1 after a ``--prompt`` prefill: the ops
    by self CPU time, grouped by input shape (which kernel each product runs, how often, for how long)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from glm_port.models.chatglm2 import ChatGLM2ForCausalLM
    from shim.nn import pack_linears, quantize_linears

    torch.set_num_threads(args.threads or torch.get_num_threads())
    with torch.device("meta"):
        model = ChatGLM2ForCausalLM(model_config(args))
    model = model.to_empty(device="cpu").to(_dtype(variant)).eval()
    with torch.no_grad():
        for parameter in model.parameters():  # random weights drawn in place: no fp32 copy to convert
            parameter.normal_(0, 0.02)
    if variant in ("int8", "int4"):
        quantize_linears(model, 8 if variant == "int8" else 4, group_size=args.group_size, skip=_output_skip(args))
    else:
        pack_linears(model, batch_size=1)
    prompt = torch.randint(3, args.vocab, (1, args.prompt), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        out = model(input_ids=prompt, position_ids=torch.arange(args.prompt)[None], use_cache=True,
                    return_last_logit=True)
        token, position = out.logits[:, -1].argmax(-1, keepdim=True), args.prompt

        def step():
            nonlocal out, token, position
            out = model(input_ids=token, position_ids=torch.full((1, 1), position), past_key_values=out.past_key_values,
                        use_cache=True, return_last_logit=True)
            token, position = out.logits[:, -1].argmax(-1, keepdim=True), position + 1

        step()  # warm up
        start, load_start = time.perf_counter(), os.getloadavg()[0]
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            for _ in range(args.profile_steps):
                step()
        elapsed = (time.perf_counter() - start) / args.profile_steps
    print(f"{variant}: {1e3 * elapsed:.1f} ms a decode step under the profiler, {torch.get_num_threads()} threads, "
          f"load average {load_start:.1f}-{os.getloadavg()[0]:.1f}")
    table = prof.key_averages(group_by_input_shape=True)
    print(table.table(sort_by="self_cpu_time_total", row_limit=args.profile_rows))


# -------------------------------------------------------------------------------------------- driver


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_shape_arguments(parser)
    parser.add_argument("--variants", nargs="+", choices=(*OURS, *CPP), default=None,
                        help="default: fp32 bf16 int8 int4, plus cpp_q8_0 cpp_q4_0 when CHATGLM_CPP_PYTHON and "
                             "CHATGLM2_CODE are set")
    parser.add_argument("--group-size", type=int, default=128, choices=(32, 64, 128), help="int4 group size")
    parser.add_argument("--keep-output", action="store_true", help="keep the output layer in bf16 (packed)")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--repeats", type=int, default=1, help="time-to-first-token runs (median kept)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every (variant, batch) this many times, in interleaved rounds (each a fresh "
                             "process): the table gives medians, the decode rate's min-max and the median "
                             "(min-max) of each round's ratio to that round's bf16 packed rate")
    parser.add_argument("--profile", choices=OURS, metavar="VARIANT",
                        help="only profile VARIANT's decode steps at batch 1 (torch.profiler; fp32, bf16, int8, int4)")
    parser.add_argument("--profile-steps", type=int, default=5)
    parser.add_argument("--profile-rows", type=int, default=15)
    parser.add_argument("--products", action="store_true", help="only the per-product table (--batches: rows)")
    parser.add_argument("--worker", nargs=3, metavar=("VARIANT", "BATCH", "FILE"), help=argparse.SUPPRESS)
    parser.add_argument("--prepare", nargs=2, metavar=("VARIANT", "FILE"), help=argparse.SUPPRESS)
    parser.add_argument("--cpp-worker", nargs=2, metavar=("VARIANT", "GGML_FILE"), help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", help=argparse.SUPPRESS)  # bench.chatglm2's pieces read it
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    return parser


def _run(command, what: str):
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        print(f"bench.quantized: {what} failed:\n{done.stderr.strip()[-2000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def _variants(args):
    code, cpp = os.environ.get("CHATGLM2_CODE"), os.environ.get("CHATGLM_CPP_PYTHON")
    missing = None
    if not (code and cpp):
        missing = "needs CHATGLM_CPP_PYTHON=/python/with/chatglm_cpp and CHATGLM2_CODE=/dir/with/modeling_chatglm.py"
    elif absent := [name for name in THUDM_FILES if not (Path(code) / name).is_file()]:
        missing = f"needs {', '.join(absent)} in CHATGLM2_CODE ({code})"
    if args.variants is None:
        if missing:
            print(f"bench.quantized: skipping {', '.join(CPP)}: chatglm-cpp {missing}")
        return list(OURS) + ([] if missing else list(CPP))
    if missing and any(v in CPP for v in args.variants):
        print(f"bench.quantized: error: chatglm-cpp {missing}", file=sys.stderr)
        return None
    return list(args.variants)


def summarize(samples: dict) -> list[dict]:
    """One row per (variant, batch) from its rounds (``samples[(variant, batch)]``: one worker result per
    round, in round order): each figure's median, the decode rate's min and max, the first round's tokens,
    the load averages seen, and ``bf16_ratios``: the decode rate over bf16 packed's **in the same round** at
    the same batch (rounds interleave the variants, so a ratio compares runs made close together)."""
    import statistics

    rows = []
    for (variant, batch), results in samples.items():
        rates = [r["decode_tok_s"] for r in results]
        row = {key: statistics.median(r[key] for r in results)
               for key in ("load_s", "file_mib", "load_rss_mib", "rss_end_mib", "ttft_ms") if key in results[0]}
        bf16 = samples.get(("bf16", batch), [])
        loads = [x for r in results for x in r.get("load_avg", [])]
        row.update(variant=variant, batch=batch, tokens=results[0]["tokens"], rounds=len(results),
                   decode_tok_s=statistics.median(rates), decode_min=min(rates), decode_max=max(rates),
                   bf16_ratios=[r["decode_tok_s"] / b["decode_tok_s"] for r, b in zip(results, bf16)],
                   load_avg=[min(loads), max(loads)] if loads else None)
        rows.append(row)
    return rows


def _ratio_cell(row: dict, bf16: dict | None) -> str:
    """The decode rate over bf16 packed's: the median of the per-round ratios (and their range) where the
    rows come from rounds, else the ratio of the two rates."""
    import statistics

    ratios = row.get("bf16_ratios")
    if ratios:
        cell = f"{statistics.median(ratios):.2f}x"
        return cell + (f" ({min(ratios):.2f}-{max(ratios):.2f})" if len(ratios) > 1 else "")
    return f"{row['decode_tok_s'] / bf16['decode_tok_s']:.2f}x" if bf16 else "n/a"


def print_table(rows: list[dict]) -> None:
    def row_of(variant, batch):
        return next((r for r in rows if r["variant"] == variant and r["batch"] == batch), None)

    print(f"{'variant':<9} {'batch':>5} {'load s':>7} {'file MiB':>9} {'load RSS MiB':>13} {'RSS end MiB':>12} "
          f"{'ttft ms':>9} "
          f"{'decode tok/s':>13} {'min-max':>11} {'same tokens':>12} {'vs bf16':>18} {'vs cpp same bits':>17} "
          f"{'load avg':>10}")
    for row in rows:
        fp32, bf16 = row_of("fp32", row["batch"]), row_of("bf16", row["batch"])
        cpp = row_of(SAME_BITS.get(row["variant"], ""), 1) if row["batch"] == 1 else None
        same = f"{sum(a == b for a, b in zip(row['tokens'], fp32['tokens']))}/{len(fp32['tokens'])}" if fp32 else "n/a"
        vs_cpp = f"{row['decode_tok_s'] / cpp['decode_tok_s']:.2f}x" if cpp else "n/a"
        file_mib = f"{row['file_mib']:.0f}" if "file_mib" in row else "n/a"
        rss_end = f"{row['rss_end_mib']:.0f}" if "rss_end_mib" in row else "n/a"
        span = f"{row['decode_min']:.2f}-{row['decode_max']:.2f}" if "decode_min" in row else "-"
        load = f"{row['load_avg'][0]:.1f}-{row['load_avg'][1]:.1f}" if row.get("load_avg") else "n/a"
        print(f"{row['variant']:<9} {row['batch']:>5} {row['load_s']:>7.2f} {file_mib:>9} {row['load_rss_mib']:>13.0f} "
              f"{rss_end:>12} {row['ttft_ms']:>9.0f} {row['decode_tok_s']:>13.2f} {span:>11} {same:>12} "
              f"{_ratio_cell(row, bf16):>18} {vs_cpp:>17} {load:>10}")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = resolve(build_parser().parse_args(argv))
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args.worker[2], args)))
        return 0
    if args.prepare:
        prepare(args.prepare[0], args, Path(args.prepare[1]))
        print(json.dumps({"prepared": args.prepare[1]}))
        return 0
    if args.cpp_worker:
        result = cpp_worker(args.cpp_worker[0], args.cpp_worker[1], args)
        result["file_mib"] = Path(args.cpp_worker[1]).stat().st_size / 2**20
        print(json.dumps(result))
        return 0
    print_cpu_line()
    if args.profile:
        profile_decode(args.profile, args)
        return 0
    if args.products:
        products(args)
        return 0
    variants = _variants(args)
    if variants is None:
        return 2
    import torch

    print(f"torch {torch.__version__}, {args.threads or torch.get_num_threads()} threads; shape: {args.layers} layers, "
          f"hidden {args.hidden}, ffn {args.ffn}, vocab {args.vocab}; prompt {args.prompt}, {args.new_tokens} new "
          f"tokens, greedy; int4 group {args.group_size}; output layer "
          f"{'kept bf16' if args.keep_output else 'quantized'}")
    samples = {}  # (variant, batch) -> one result per round
    with tempfile.TemporaryDirectory(prefix="bench-quantized-") as scratch:
        scratch = Path(scratch)
        thudm_dir = scratch / "thudm"
        runs = [(r, b, v) for r in range(args.rounds) for b in args.batches for v in variants]
        for round_, batch, variant in runs:  # interleaved: every variant once per round
            if variant in CPP:
                if batch != 1:
                    continue
                ggml = scratch / f"{variant}.bin"
                if not thudm_dir.exists():
                    done = subprocess.run([sys.executable, "-m", "bench.chatglm2", *_shape_argv(args),
                                           "--write-thudm-dir", str(thudm_dir)], cwd=ROOT,
                                          env={**os.environ, "PYTHONPATH": str(ROOT)})
                    if done.returncode:
                        return 1
                if not ggml.exists():
                    done = subprocess.run([os.environ["CHATGLM_CPP_PYTHON"], "-m", "chatglm_cpp.convert", "-i",
                                           str(thudm_dir), "-t", CPP[variant], "-o", str(ggml)], cwd=ROOT,
                                          capture_output=True, text=True)
                    if done.returncode:
                        print(f"bench.quantized: chatglm-cpp convert failed:\n{done.stderr[-2000:]}",
                              file=sys.stderr)
                        return 1
                result = _run([os.environ["CHATGLM_CPP_PYTHON"], "-m", "bench.quantized", *argv,
                               "--cpp-worker", variant, str(ggml)], f"{variant} batch 1")
            else:
                saved = scratch / f"{variant}.safetensors"
                if not saved.exists() and _run([sys.executable, "-m", "bench.quantized", *argv, "--prepare",
                                                variant, str(saved)], f"writing {variant}'s weights") is None:
                    return 1
                result = _run([sys.executable, "-m", "bench.quantized", *argv, "--worker", variant, str(batch),
                               str(saved)], f"{variant} batch {batch}")
            if result is None:
                return 1
            samples.setdefault((variant, batch), []).append(result)
            shown = {k: v for k, v in result.items() if k != "tokens"}
            print(f"  round {round_ + 1} {variant} batch {batch}: {json.dumps(shown)}", flush=True)
    rows = summarize(samples)
    print_table(rows)
    return 0


def _shape_argv(args) -> list[str]:
    return [f"--{name.replace('_', '-')}={getattr(args, name)}"
            for name in ("layers", "hidden", "ffn", "heads", "groups", "kv_channels", "vocab", "prompt", "new_tokens")]


if __name__ == "__main__":
    sys.exit(main())
