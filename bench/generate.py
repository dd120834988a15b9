"""GLM generation speed and memory: KV-cached decoding against recomputing the prefix, the machine's bound.

    python -m bench.generate                      # GLM-Large shape, random weights, prompts 128 and 512, 64 new
    python -m bench.generate --layers 2 --hidden 64 --heads 4 --vocab 1024 --prompts 16,32 --new-tokens 8  # smoke
    GLM_HF_CODE=... GLM_REF_PYTHON=... python -m bench.generate --thudm   # adds THUDM's remote-code model

Each variant runs in a fresh process (bench/_measure.py's reason: the peak RSS starts clean). Greedy decoding,
batch 1 by default, exactly --new-tokens tokens (no end token), through ``model.generate``:

- ``cached``: glm_port's GLMForConditionalGeneration with its KV cache (transformers' DynamicCache);
- ``recompute``: the same model, ``use_cache=False`` (the whole prefix every step);
- ``packed`` (``--variants cached,packed,recompute``): ``cached`` after ``shim.nn.pack_linears`` (the linear
  weights in oneDNN's layout where that measures faster), as glm-generate runs on CPU;
- ``static`` (``--variants cached,static,recompute``): a preallocated cache (transformers' StaticCache), no
  growing copy of the keys and values at each step;
- ``compiled`` (``--variants cached,compiled``): ``static`` with the decode step compiled by ``torch.compile``
  (``bench/_decode.py``: CUDA graphs on a GPU), as gpt-fast decodes; its warm-up run compiles;
- ``thudm`` (``--thudm``): THUDM's published modeling_glm.py on the same weights, in the Python named by
  GLM_REF_PYTHON (transformers 4.27); its cache never reaches it under transformers >= 4.26, so it recomputes.

Columns: time to first token (the prompt's forward), decode ms per token after it, tokens/s over the decode,
extra peak RSS of the generation. ``bound`` is the memory-bandwidth limit at batch 1: every weight is read
once per token, so tokens/s <= bandwidth / weight bytes, with the bandwidth measured here as an fp32
matrix-vector product over a matrix far larger than the caches (the faster of ``torch.mv`` and oneDNN's
packed product: here torch.mv streams about 20 GB/s, the packed product about 44); on a GPU (``--device cuda``)
it is the device's copy rate (read + write bytes, ``bench/_decode.py``). ``--load`` also writes the weights as a
sharded safetensors checkpoint and reports the peak RSS of ``from_pretrained`` against the weights' size.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from bench._decode import compile_kwargs, copy_rate, sync
from bench._measure import MIB, current_rss_bytes, peak_rss_bytes, print_cpu_line, run_worker

SCRIPT = __spec__.name if __spec__ is not None else "bench.generate"  # workers: python -m bench.generate


def parse(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=50048)
    parser.add_argument("--positions", type=int, default=1024)
    parser.add_argument("--prompts", default="128,512", help="prompt lengths, comma-separated")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--json", default=None, metavar="FILE",
                        help="also write the rows, the bandwidth and the bound to FILE as JSON")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--variants", default="cached,recompute")
    parser.add_argument("--thudm", action="store_true", help="add THUDM's remote-code model (GLM_HF_CODE, GLM_REF_PYTHON)")
    parser.add_argument("--load", action="store_true", help="measure the sharded-checkpoint load's peak RSS")
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--prompt", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--path", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def config_dict(args) -> dict:
    return {"model_type": "glm", "num_layers": args.layers, "hidden_size": args.hidden,
            "num_attention_heads": args.heads, "vocab_size": args.vocab, "max_sequence_length": args.positions,
            "block_position_encoding": True, "attention_scale": 1.0}


def glm_inputs(prompt_length: int, new_tokens: int, vocab: int, batch: int):
    """A prompt of random ids ending in a blank, laid out as build_inputs_for_generation does."""
    import torch

    from glm_port.models.glm.tokenizer import generation_mask

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(10, vocab - 10, (batch, prompt_length), generator=g)
    total = prompt_length + new_tokens + 1
    positions = torch.zeros(batch, 2, total, dtype=torch.long)
    positions[:, 0, :prompt_length] = torch.arange(prompt_length)
    positions[:, 0, prompt_length:] = prompt_length - 2
    positions[:, 1, prompt_length:] = torch.arange(1, new_tokens + 2)
    mask = generation_mask(torch.ones(batch, prompt_length, dtype=torch.bool), prompt_length - 1, total)
    return ids, positions, mask


def worker(args) -> dict:
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.worker == "bandwidth":
        if args.device.startswith("cuda"):
            rate = copy_rate(args.device) / 1e9
            return {"mv_gb_per_s": float("nan"), "copy_gb_per_s": rate, "gb_per_s": rate}
        return matvec_bandwidth()
    if args.worker == "load":
        return measure_load(args)
    from glm_port.models.glm.config import GLMConfig
    from glm_port.models.glm.hf import GLMForConditionalGeneration

    torch.manual_seed(0)
    with torch.device(args.device):  # drawn where it runs (a 10B model drawn on the CPU takes minutes)
        model = GLMForConditionalGeneration(GLMConfig(**config_dict(args))).eval()
    if args.dtype == "bf16":
        model.to(torch.bfloat16)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    if args.worker == "packed":
        from shim.nn import pack_linears

        pack_linears(model, batch_size=args.batch)
    ids, positions, mask = (t.to(args.device) for t in glm_inputs(args.prompt, args.new_tokens, args.vocab,
                                                                   args.batch))
    clock = {}
    extra = compile_kwargs(args.device) if args.worker == "compiled" else {}
    if args.worker == "static":
        extra = {"cache_implementation": "static"}

    def first_token(input_ids, scores, **kwargs):
        clock.setdefault("first", time.perf_counter())
        return torch.zeros(input_ids.size(0), dtype=torch.bool, device=input_ids.device)

    from transformers import StoppingCriteriaList

    def run():
        clock.clear()
        sync(args.device)
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=ids, position_ids=positions, generation_attention_mask=mask,
                                 max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                                 eos_token_id=None, pad_token_id=0, use_cache=args.worker != "recompute",
                                 stopping_criteria=StoppingCriteriaList([first_token]), **extra)
        sync(args.device)
        end = time.perf_counter()
        return out, clock["first"] - start, end - clock["first"]

    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    baseline = torch.cuda.memory_allocated() if cuda else peak_rss_bytes()
    warm = time.perf_counter()
    out, _, _ = run()  # warm-up (and compilation), and the peak: first-call overheads stay out of the timing below
    warm_s = time.perf_counter() - warm
    if cuda:
        extra_peak = torch.cuda.max_memory_allocated() - baseline
    else:
        extra_peak = peak_rss_bytes() - max(baseline, current_rss_bytes())
    out, ttft, decode = run()
    steps = args.new_tokens - 1
    return {"ttft_ms": 1e3 * ttft, "decode_ms_per_token": 1e3 * decode / steps,
            "tokens_per_s": args.batch * steps / decode, "extra_peak_mib": max(extra_peak, 0) / MIB,
            "weight_bytes": weight_bytes, "tokens": out[0, -args.new_tokens:].tolist(), "warm_s": warm_s}


def thudm_worker(args) -> dict:
    """THUDM's modeling_glm.py on the same random weights (same seed, our model's state dict), in GLM_REF_PYTHON."""
    code, python = os.environ.get("GLM_HF_CODE"), os.environ.get("GLM_REF_PYTHON")
    if not (code and python):
        raise SystemExit("--thudm needs GLM_HF_CODE (THUDM's modeling_glm.py directory) and GLM_REF_PYTHON")
    import subprocess

    with tempfile.TemporaryDirectory() as tmp:
        args.path = tmp
        save_weights(args)  # this worker only writes the weights; THUDM's model runs in GLM_REF_PYTHON
        probe = THUDM_PROBE.format(code=code, tmp=tmp, prompt=args.prompt, new=args.new_tokens, vocab=args.vocab,
                                   threads=args.threads or 0)
        done = subprocess.run([python, "-c", probe], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": os.path.dirname(os.path.dirname(SCRIPT))})
        if done.returncode:
            raise SystemExit(f"thudm worker failed:\n{done.stderr[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])


THUDM_PROBE = r'''
import json, sys, time, torch
sys.path.insert(0, {code!r})
if {threads}: torch.set_num_threads({threads})
import modeling_glm
from configuration_glm import GLMConfig
from safetensors.torch import load_file
from bench.generate import glm_inputs
config = GLMConfig(**{{**json.load(open({tmp!r} + "/hf/config.json")), "output_predict": True}})
model = modeling_glm.GLMForConditionalGeneration(config).eval()
model.load_state_dict(load_file({tmp!r} + "/hf/model.safetensors"), strict=False)
ids, positions, mask = glm_inputs({prompt}, {new}, {vocab}, 1)
times = []
class Clock:
    def __call__(self, input_ids, scores, **kw):
        times.append(time.perf_counter()); return False
from transformers import StoppingCriteriaList
for _ in range(2):
    times.clear(); start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(input_ids=ids, position_ids=positions, generation_attention_mask=mask.float(),
                             max_new_tokens={new}, min_new_tokens={new}, do_sample=False, num_beams=1,
                             eos_token_id=None, pad_token_id=0, stopping_criteria=StoppingCriteriaList([Clock()]))
    end = time.perf_counter()
ttft, decode = times[0] - start, end - times[0]
print(json.dumps({{"ttft_ms": 1e3 * ttft, "decode_ms_per_token": 1e3 * decode / ({new} - 1),
                  "tokens_per_s": ({new} - 1) / decode, "extra_peak_mib": float("nan"),
                  "tokens": out[0, -{new}:].tolist()}}))
'''


def save_weights(args, shards: int = 1) -> int:
    import torch

    from glm_port.models.glm import weights
    from glm_port.models.glm.config import GLMConfig
    from glm_port.models.glm.hf import GLMForConditionalGeneration

    torch.manual_seed(0)
    model = GLMForConditionalGeneration(GLMConfig(**config_dict(args)))
    state = {k[len("glm."):]: v for k, v in model.state_dict().items()}
    weights.save_hf(state, os.path.join(args.path, "hf"), config_dict(args), shards=shards)
    return sum(v.numel() * v.element_size() for v in state.values())


def measure_load(args) -> dict:
    import torch

    from glm_port.models.glm.hf import GLMForConditionalGeneration

    directory = os.path.join(args.path, "hf")
    files = sum(os.path.getsize(os.path.join(directory, f)) for f in os.listdir(directory) if f.endswith(".safetensors"))
    baseline = peak_rss_bytes()  # torch imported first: its own footprint is not the load's
    model = GLMForConditionalGeneration.from_pretrained(
        directory, dtype=torch.bfloat16 if args.dtype == "bf16" else torch.float32)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    # Read every weight once, as the first forward would: memory-mapped shards count only once touched.
    checksum = sum(float(p.detach().float().sum()) for p in model.parameters())
    assert checksum == checksum  # a NaN would mean a weight read wrongly
    return {"load_peak_mib": (peak_rss_bytes() - baseline) / MIB, "weight_mib": weight_bytes / MIB,
            "checkpoint_mib": files / MIB}


def matvec_bandwidth(megabytes: int = 512, repeats: int = 10) -> dict:
    """GB/s an fp32 matrix-vector product reads (the matrix once per product), through torch's ``mv``
    and through oneDNN's packed product (``shim.nn.PackedLinear``'s); ``gb_per_s`` is the faster, so the
    bound is what this machine can stream, not what one library call reaches."""
    import torch

    from shim.nn.packed_linear import packable

    rows = megabytes * MIB // 4 // 4096
    matrix, vector = torch.randn(rows, 4096), torch.randn(4096)
    products = {"mv_gb_per_s": lambda: torch.mv(matrix, vector)}
    if packable(matrix):
        packed = torch.ops.mkldnn._reorder_linear_weight(matrix, 1)
        products["packed_gb_per_s"] = lambda: torch.ops.mkldnn._linear_pointwise(
            vector[None], packed, None, "none", [None], "")
    rates = {}
    for name, product in products.items():
        product()
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            product()
            best = min(best, time.perf_counter() - start)
        rates[name] = matrix.numel() * 4 / best / 1e9
    return {**rates, "gb_per_s": max(rates.values())}


def main(argv=None) -> None:
    args = parse(argv)
    if args.worker == "thudm":
        print(json.dumps(thudm_worker(args)))
        return
    if args.worker:
        print(json.dumps(worker(args)))
        return
    from tqdm import tqdm

    print_cpu_line()
    passthrough = list(argv if argv is not None else sys.argv[1:])
    if "--worker" in passthrough:
        raise SystemExit("--worker is internal")
    prompts = [int(p) for p in args.prompts.split(",")]
    variants = args.variants.split(",") + (["thudm"] if args.thudm else [])
    rates = run_worker(SCRIPT, "bandwidth", passthrough)
    bandwidth = rates["gb_per_s"]
    rows = []
    for prompt in tqdm(prompts, desc="prompt lengths", leave=False):
        for variant in tqdm(variants, desc="variants", leave=False):
            rows.append({"prompt": prompt, "variant": variant,
                         **run_worker(SCRIPT, variant, [*passthrough, "--prompt", str(prompt)])})
    weight_bytes = next(r["weight_bytes"] for r in rows if "weight_bytes" in r)
    bound = bandwidth * 1e9 / weight_bytes
    print(f"model: {args.layers} layers, hidden {args.hidden}, vocab {args.vocab}, {weight_bytes / 1e9:.2f} GB of "
          f"{args.dtype} weights; batch {args.batch}, {args.new_tokens} new tokens")
    if "copy_gb_per_s" in rates:
        print(f"bandwidth ({args.device} copy, read + write): {bandwidth:.1f} GB/s -> bound {bound:.1f} tokens/s "
              f"at batch 1")
    else:
        print(f"bandwidth (fp32 matrix-vector): torch.mv {rates['mv_gb_per_s']:.1f} GB/s, oneDNN packed "
              f"{rates.get('packed_gb_per_s', float('nan')):.1f} GB/s -> bound {bound:.1f} tokens/s at batch 1 (the "
              f"faster; torch.mv's alone: {rates['mv_gb_per_s'] * 1e9 / weight_bytes:.1f})")
    print(f"{'prompt':>6} {'variant':<10} {'ttft ms':>9} {'decode ms/tok':>14} {'tokens/s':>9} {'of bound':>9} "
          f"{'extra peak MiB':>15} {'same tokens':>12} {'warm-up s':>10}")
    for row in rows:
        reference = next(r for r in rows if r["prompt"] == row["prompt"] and r["variant"] == rows[0]["variant"])
        same = "yes" if row["tokens"] == reference["tokens"] else "NO"
        print(f"{row['prompt']:>6} {row['variant']:<10} {row['ttft_ms']:>9.1f} {row['decode_ms_per_token']:>14.2f} "
              f"{row['tokens_per_s']:>9.2f} {row['tokens_per_s'] / args.batch / bound:>8.0%} "
              f"{row['extra_peak_mib']:>15.1f} {same:>12} {row.get('warm_s', float('nan')):>10.1f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump({"bandwidth_gb_per_s": bandwidth, "bound_tokens_per_s": bound, "batch": args.batch,
                       "rows": [{k: v for k, v in r.items() if k != "tokens"} | {
                           "same_tokens": r["tokens"] == next(x for x in rows if x["prompt"] == r["prompt"])["tokens"]}
                           for r in rows]}, out, indent=1)
    by = {(r["prompt"], r["variant"]): r for r in rows}
    if "cached" in variants and len(prompts) > 1:
        flat = by[(prompts[-1], "cached")]["decode_ms_per_token"] / by[(prompts[0], "cached")]["decode_ms_per_token"]
        print(f"cached decode time per token, prompt {prompts[-1]} / {prompts[0]}: {flat:.2f}x (goal <= 1.5x)")
    for other in ("recompute", "thudm"):
        if other in variants and "cached" in variants:
            for prompt in prompts:
                ratio = by[(prompt, other)]["decode_ms_per_token"] / by[(prompt, "cached")]["decode_ms_per_token"]
                print(f"prompt {prompt}: cached is {ratio:.1f}x faster per token than {other}")
    if args.load:
        with tempfile.TemporaryDirectory() as tmp:
            args.path = tmp
            save_weights(args, args.shards)
            load = run_worker(SCRIPT, "load", [*passthrough, "--path", tmp])
        print(f"sharded load ({args.shards} fp32 safetensors shards, {load['checkpoint_mib']:.0f} MiB) to {args.dtype}, "
              f"then every weight read once: peak RSS {load['load_peak_mib']:.0f} MiB for {load['weight_mib']:.0f} MiB "
              f"of loaded weights = {load['load_peak_mib'] / load['weight_mib']:.2f}x (goal <= 1.2x at the "
              f"checkpoint's dtype), {load['load_peak_mib'] / load['checkpoint_mib']:.2f}x the checkpoint")


if __name__ == "__main__":
    main()
