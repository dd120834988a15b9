"""ChatGLM2 decoding: glm_port vs transformers' GlmForCausalLM (and THUDM's code, chatglm-cpp), same weights.

Each (variant, batch) runs in a fresh process. Every variant gets the same random weights: glm_port's
ChatGLM2 built from one seed, converted in memory for transformers' GLM with glm-convert's mapping,
loaded as is into THUDM's ChatGLMForConditionalGeneration, written as a THUDM directory and converted by
chatglm-cpp's converter for chatglm-cpp. The prompt is random token ids; decoding is
greedy with no stop token, so every run produces exactly --new-tokens tokens.

  ttft ms        time to first token: prefill of the whole prompt + one token (``max_new_tokens=1``)
  decode tok/s   batch * (new_tokens - 1) / (time from the first token to the last, in the full generation)
  peak MiB       extra peak memory of the full generation over the loaded model: on CPU the RSS high-water
                 mark (reset before the run, Linux's clear_refs) minus the RSS then; on a GPU
                 ``torch.cuda.max_memory_allocated`` minus what was allocated before
  bound %        decode steps/s x the bytes of weights a step reads (every matrix; of the embedding table
                 only the rows it looks up) over the device's copy rate measured in the same process
                 (``copy_rate``: a 1 GiB device-to-device copy, read + write bytes per second), so 100% is a
                 step that does nothing but stream its weights once at the rate a plain copy reaches
  same tokens    positions of row 0 where the variant's greedy tokens equal glm_port's
  min-max        with --rounds N > 1: every (variant, batch) runs N times, round after round (so a slow spell
                 of a shared machine falls on every variant); the columns are medians, this is the decode range
  LoRA samples/s finetune steps at ADGEN's shape (see lora_worker); first loss must agree across variants

Variants: ``glm_port`` (the model as ``from_pretrained`` returns it), ``packed`` (the same after
``shim.nn.pack_linears`` for the run's batch, as ``glm-chat`` and ``glm-generate`` run on CPU) and
``transformers`` use ``generate`` (transformers' DynamicCache, SDPA);
``compiled`` is glm_port's model decoding as gpt-fast does: a static cache (``cache_implementation="static"``)
and the decode step compiled by ``torch.compile`` through transformers' ``compile_config`` (``mode=
"reduce-overhead"``, i.e. CUDA graphs, on a GPU; inductor's default on the CPU); its first full generation
compiles and is not timed (``compile s``); on by default on a GPU, asked for by name on the CPU.
``thudm`` (only with CHATGLM2_CODE=/dir holding THUDM's modeling_chatglm.py and configuration_chatglm.py)
runs its own forward in a greedy loop with its tuple cache, because its ``generate`` hooks predate
transformers 5.

``chatglm_cpp_f32`` and ``chatglm_cpp_f16``: chatglm-cpp (PyPI ``chatglm-cpp``, li-plus/chatglm.cpp, a
C++/GGML runtime), the CPU path a user would otherwise pick. They need CHATGLM_CPP_PYTHON=/venv/bin/python,
a Python where chatglm-cpp is installed next to a transformers THUDM's remote code loads under (4.x; its
converter goes through ``AutoModel.from_pretrained(trust_remote_code=True)``), and CHATGLM2_CODE, whose
modeling/configuration/tokenization .py, tokenizer.model (and quantization.py when there, else a stub that
raises) are copied at run time into a temporary directory where the same seeded weights are written as
THUDM lays them out (config.json with THUDM's fields and auto_map, safetensors shards). chatglm-cpp's own
converter, ``python -m chatglm_cpp.convert -i DIR -t f32|f16``, makes the GGML file (TMPDIR picks where;
the 6b-4layers shape takes about 5.4 GB for the directory plus the GGML file). The timed loop is the one
of chatglm-cpp's ``Pipeline`` (``model.generate_next_token`` with ``do_sample=False``, argmax) without
its stop at eos, on the same prompt ids; chatglm-cpp has no batching (batch > 1 shows n/a), no device
but the CPU, and picks its own threads (all cores up to 4, half of them above; --threads does not reach
it; its threads meet at a barrier after every op, so another process on the cores costs it far more than
torch: time it on a quiet machine). Its f16 file keeps norms and the qkv bias in f32 and computes in ggml's mixed precision, so its
tokens may drift from glm_port's at --dtype float32.

    python -m bench.chatglm2                      # 4 layers of ChatGLM2-6B at full width, prompt 512, 128 new
    python -m bench.chatglm2 --preset tiny        # smoke run: 2 layers, hidden 64
    python -m bench.chatglm2 --batches 1 --rounds 3   # 3 interleaved rounds: medians and the decode min-max
    python -m bench.chatglm2 --layers 28 --device cuda --dtype bfloat16   # the whole 6B shape on a GPU
    CHATGLM2_CODE=/dir CHATGLM_CPP_PYTHON=/venv/bin/python python -m bench.chatglm2   # + THUDM, chatglm-cpp
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._decode import compile_kwargs, copy_rate, sync, weight_bytes_per_step
from bench._measure import print_cpu_line

ROOT = Path(__file__).resolve().parents[1]
CPP_VARIANTS = {"chatglm_cpp_f32": "f32", "chatglm_cpp_f16": "f16"}
VARIANTS = ("glm_port", "packed", "compiled", "transformers", "thudm", *CPP_VARIANTS)
# What chatglm-cpp's converter loads from a THUDM directory besides the weights and config.json.
THUDM_FILES = ("modeling_chatglm.py", "configuration_chatglm.py", "tokenization_chatglm.py", "tokenizer.model")
THUDM_AUTO_MAP = {
    "AutoConfig": "configuration_chatglm.ChatGLMConfig",
    "AutoModel": "modeling_chatglm.ChatGLMForConditionalGeneration",
    "AutoModelForCausalLM": "modeling_chatglm.ChatGLMForConditionalGeneration",
}
PRESETS = {
    "6b-4layers": dict(layers=4, hidden=4096, ffn=13696, heads=32, groups=2, kv_channels=128, vocab=65024),
    "tiny": dict(layers=2, hidden=64, ffn=160, heads=4, groups=2, kv_channels=16, vocab=1024),
}


def model_config(args):
    from glm_port.models.chatglm2 import ChatGLM2Config

    return ChatGLM2Config(
        num_layers=args.layers, hidden_size=args.hidden, ffn_hidden_size=args.ffn, num_attention_heads=args.heads,
        multi_query_group_num=args.groups, kv_channels=args.kv_channels, padded_vocab_size=args.vocab,
        seq_length=max(2048, args.prompt + args.new_tokens),
    )


def seeded(args):
    """glm_port's ChatGLM2 with the bench's random weights (seed 0), float32: every variant starts here.
    On a GPU they are drawn there (a 28-layer 6B model drawn on the CPU takes minutes per worker), so its
    numbers differ from the CPU's, the same for every variant of a run."""
    import torch

    from glm_port.models.chatglm2 import ChatGLM2ForCausalLM

    torch.manual_seed(0)
    with torch.device(args.device if args.device.startswith("cuda") else "cpu"):
        return ChatGLM2ForCausalLM(model_config(args))


def write_thudm_directory(args, directory) -> None:
    """The seeded weights as THUDM publishes a ChatGLM2 directory, for chatglm-cpp's converter to load.

    config.json carries THUDM's fields plus ``auto_map`` (and ``original_rope``, ``max_length``, which
    THUDM's ChatGLMModel reads); the weights are safetensors shards under THUDM's names; THUDM's code and
    tokenizer.model are copied from CHATGLM2_CODE into this (temporary) directory only.
    """
    from glm_port.models.chatglm2.weights import save_sharded

    code = Path(os.environ["CHATGLM2_CODE"])
    directory = Path(directory)
    model = seeded(args)
    save_sharded(model.state_dict(), directory, fmt="safetensors")
    raw = model.config.to_dict()
    raw.update(architectures=["ChatGLMModel"], auto_map=THUDM_AUTO_MAP, original_rope=True,
               max_length=model.config.seq_length, torch_dtype="float32")
    (directory / "config.json").write_text(json.dumps(raw, indent=2), encoding="utf-8")
    for name in THUDM_FILES:
        shutil.copyfile(code / name, directory / name)
    if (code / "tokenizer_config.json").is_file():
        shutil.copyfile(code / "tokenizer_config.json", directory / "tokenizer_config.json")
    else:
        (directory / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "ChatGLMTokenizer",
            "auto_map": {"AutoTokenizer": ["tokenization_chatglm.ChatGLMTokenizer", None]},
        }), encoding="utf-8")
    if (code / "quantization.py").is_file():
        shutil.copyfile(code / "quantization.py", directory / "quantization.py")
    else:  # modeling_chatglm.py imports it lazily (int4/int8 only); transformers checks that it exists
        (directory / "quantization.py").write_text(
            "def quantize(*args, **kwargs):\n"
            "    raise NotImplementedError('bench.chatglm2: THUDM quantization.py was not in CHATGLM2_CODE')\n",
            encoding="utf-8")


def build(variant: str, args):
    import torch

    config = model_config(args)
    ours = seeded(args)
    if variant in ("glm_port", "packed", "compiled"):
        model = ours
    elif variant == "transformers":
        from transformers import GlmForCausalLM

        from glm_port.models.chatglm2.convert import to_glm_config, to_glm_plan

        class InMemory(dict):
            directory = "<memory>"

        glm_config = to_glm_config(config)
        glm_config._attn_implementation = "sdpa"
        with torch.device("meta"):
            model = GlmForCausalLM(glm_config)
        state = {name: get() for name, get in to_glm_plan(config, InMemory(ours.state_dict()))}
        model.load_state_dict(state, assign=True)
        from transformers.models.glm.modeling_glm import GlmRotaryEmbedding

        model.model.rotary_emb = GlmRotaryEmbedding(glm_config)  # its buffers were left on the meta device
        del ours, state
    else:
        import importlib
        import types

        package = types.ModuleType("_thudm_chatglm2")
        package.__path__ = [os.environ["CHATGLM2_CODE"]]
        sys.modules["_thudm_chatglm2"] = package
        cm = importlib.import_module("_thudm_chatglm2.configuration_chatglm")
        mm = importlib.import_module("_thudm_chatglm2.modeling_chatglm")
        fields = {k: getattr(config, k) for k in (
            "num_layers", "padded_vocab_size", "hidden_size", "ffn_hidden_size", "kv_channels", "num_attention_heads",
            "seq_length", "layernorm_epsilon", "add_qkv_bias", "multi_query_attention", "multi_query_group_num")}
        thudm_config = cm.ChatGLMConfig(**fields, original_rope=True, torch_dtype=getattr(torch, args.dtype))
        thudm_config.max_length, thudm_config.use_cache = config.seq_length, True
        with torch.device("meta"):
            model = mm.ChatGLMForConditionalGeneration(thudm_config, empty_init=False)
        model.load_state_dict(ours.state_dict(), strict=False, assign=True)
        model.transformer.rotary_pos_emb.inv_freq = 1.0 / (
            10000 ** (torch.arange(0, config.kv_channels // 2, 2, dtype=torch.float32) / (config.kv_channels // 2)))
        del ours
    return model.to(device=args.device, dtype=getattr(torch, args.dtype)).eval()


def greedy(variant, model, prompt, new_tokens, clock=None):
    """Greedy tokens ``[batch, new_tokens]``; ``clock["first"]`` gets the time the first token was chosen, so
    the decode rate comes from the same run (a separate time-to-first-token run can differ from this
    run's prefill by seconds on a shared machine)."""
    import torch

    clock = {} if clock is None else clock

    def first_token(*_args, **_kwargs):
        clock.setdefault("first", time.perf_counter())
        return torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)

    with torch.inference_mode():
        if variant != "thudm":
            from transformers import StoppingCriteriaList

            extra = compile_kwargs(str(prompt.device)) if variant == "compiled" else {}
            return model.generate(
                prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=new_tokens,
                min_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0,
                stopping_criteria=StoppingCriteriaList([first_token]), **extra,
            )[:, prompt.shape[1]:]
        batch, length = prompt.shape
        positions = torch.arange(length, device=prompt.device).expand(batch, length)
        out = model(input_ids=prompt, position_ids=positions, use_cache=True, return_last_logit=True)
        tokens = [out.logits[:, -1].argmax(-1, keepdim=True)]
        tokens[-1].tolist(), first_token()
        for i in range(new_tokens - 1):
            position = torch.full((batch, 1), length + i, device=prompt.device)
            out = model(input_ids=tokens[-1], position_ids=position, past_key_values=out.past_key_values,
                        use_cache=True, return_last_logit=True)
            tokens.append(out.logits[:, -1].argmax(-1, keepdim=True))
        return torch.cat(tokens, 1)


def status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field + ":"))


def reset_peak_rss() -> int:
    """Reset the process's RSS high-water mark (Linux: ``5`` to ``/proc/self/clear_refs``); the RSS now."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")
    return status_kib("VmRSS") * 1024


def peak_rss() -> int:
    return status_kib("VmHWM") * 1024


def decode_rate(tokens: int, seconds: float) -> float:
    """Decode tokens/s; NaN for a zero-length interval (one new token)."""
    return tokens / seconds if seconds > 0 else float("nan")


def worker(variant: str, batch: int, args) -> dict:
    import torch

    torch.set_num_threads(args.threads or torch.get_num_threads())
    model = build(variant, args)
    if variant == "packed":
        from shim.nn import pack_linears

        pack_linears(model, batch_size=batch)
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, args.vocab, (batch, args.prompt), generator=generator).to(args.device)
    greedy(variant, model, prompt[:, :16], 2)  # warm up code paths
    compile_s = float("nan")
    if variant == "compiled":  # compiles the decode step for this batch and cache length (not timed below)
        sync(args.device)
        start = time.perf_counter()
        greedy(variant, model, prompt, args.new_tokens)
        sync(args.device)
        compile_s = time.perf_counter() - start
    ttfts = []
    for _ in range(args.repeats):
        sync(args.device)
        start = time.perf_counter()
        greedy(variant, model, prompt, 1)
        sync(args.device)
        ttfts.append(time.perf_counter() - start)
    ttft = sorted(ttfts)[len(ttfts) // 2]
    if args.device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        baseline = torch.cuda.memory_allocated()
    else:
        baseline = reset_peak_rss()
    sync(args.device)
    clock = {}
    tokens = greedy(variant, model, prompt, args.new_tokens, clock)
    sync(args.device)
    decode = time.perf_counter() - clock["first"]
    if args.device.startswith("cuda"):
        peak = torch.cuda.max_memory_allocated() - baseline
    else:
        peak = peak_rss() - baseline
    rate = decode_rate(batch * (args.new_tokens - 1), decode)
    bound = weight_bytes_per_step(model) * (rate / batch) / copy_rate(args.device)
    return {
        "variant": variant, "batch": batch, "ttft_ms": 1e3 * ttft, "decode_tok_s": rate,
        "peak_mib": peak / 2**20, "tokens": tokens[0].tolist(), "bound": bound, "compile_s": compile_s,
    }


def cpp_worker(variant: str, ggml_file: str, args) -> dict:
    """chatglm-cpp's greedy decode at batch 1 from its GGML file; the figures as ``worker``'s."""
    import chatglm_cpp
    import torch

    rss_before, start = status_kib("VmRSS") * 1024, time.perf_counter()
    pipeline = chatglm_cpp.Pipeline(ggml_file, max_length=args.prompt + args.new_tokens)
    load_s, load_rss = time.perf_counter() - start, status_kib("VmRSS") * 1024 - rss_before
    model = pipeline.model
    gen_config = chatglm_cpp._C.GenerationConfig(
        max_length=args.prompt + args.new_tokens, max_new_tokens=args.new_tokens,
        max_context_length=args.prompt, do_sample=False, top_k=1)
    generator = torch.Generator().manual_seed(1)
    prompt = torch.randint(3, args.vocab, (1, args.prompt), generator=generator)[0].tolist()

    def greedy_ids(prompt_ids, new_tokens):
        # chatglm_cpp.Pipeline._stream_generate_ids, without its stop at eos
        ids, n_past, out = list(prompt_ids), 0, []
        for _ in range(new_tokens):
            token = model.generate_next_token(ids, None, gen_config, n_past, len(prompt_ids))
            clock.setdefault("first", time.perf_counter())
            n_past = len(ids)
            ids.append(token)
            out.append(token)
        return out

    clock = {}
    greedy_ids(prompt[:16], 2)  # warm up
    ttfts = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        greedy_ids(prompt, 1)
        ttfts.append(time.perf_counter() - start)
    ttft = sorted(ttfts)[len(ttfts) // 2]
    baseline = reset_peak_rss()
    clock.clear()
    tokens = greedy_ids(prompt, args.new_tokens)
    decode = time.perf_counter() - clock["first"]
    return {
        "variant": variant, "batch": 1, "ttft_ms": 1e3 * ttft,
        "decode_tok_s": decode_rate(args.new_tokens - 1, decode),
        "peak_mib": (peak_rss() - baseline) / 2**20, "tokens": tokens,
        "load_s": load_s, "load_rss_mib": load_rss / 2**20,  # reading the GGML file into its Pipeline
    }


LORA_TARGETS = {"glm_port": ["query_key_value"], "transformers": ["q_proj", "k_proj", "v_proj"]}


def lora_worker(variant: str, batch: int, args) -> dict:
    """LoRA finetune steps at ADGEN's shape (source 64 + target 128 + eos, loss on the target): samples/s.

    MindFormers' settings (rank 8, alpha 32, dropout 0.1) through PEFT, AdamW on the adapters. LoRA on
    THUDM's fused ``query_key_value`` vs on transformers' separate q/k/v projections: not the same adapter
    (3 x rank 8 there), the same frozen network; the first step's loss (adapters still zero) must agree.
    """
    import torch
    from peft import LoraConfig, TaskType, get_peft_model

    torch.set_num_threads(args.threads or torch.get_num_threads())
    model = build(variant, args).train()
    model = get_peft_model(model, LoraConfig(task_type=TaskType.CAUSAL_LM, r=8, lora_alpha=32, lora_dropout=0.1,
                                             target_modules=LORA_TARGETS[variant]))
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(3, args.vocab, (batch, 64 + 128 + 1), generator=generator).to(args.device)
    labels = ids.clone()
    labels[:, :64] = -100
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)

    def step():
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.item()

    first_loss = step()
    sync(args.device)
    start = time.perf_counter()
    for _ in range(args.lora_steps):
        step()
    sync(args.device)
    elapsed = time.perf_counter() - start
    return {"variant": variant, "batch": batch, "samples_s": batch * args.lora_steps / elapsed, "loss": first_loss}


def add_shape_arguments(parser) -> None:
    """The model shape (a preset, each size overridable), prompt, new tokens and batches: this bench's and
    bench.quantized's."""
    parser.add_argument("--preset", choices=PRESETS, default="6b-4layers")
    for name in ("layers", "hidden", "ffn", "heads", "groups", "kv_channels", "vocab"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=None)
    parser.add_argument("--prompt", type=int, default=512)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])


def build_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_shape_arguments(parser)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=None,
                        help="default: glm_port, packed and transformers (and compiled off the CPU), plus thudm when "
                             "CHATGLM2_CODE is set, plus chatglm_cpp_f32/f16 on the CPU when CHATGLM_CPP_PYTHON is "
                             "set too")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--repeats", type=int, default=3, help="time-to-first-token runs (median kept)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every (variant, batch) this many times, in interleaved rounds (each in a fresh "
                             "process); the table shows each column's median and the decode rate's min-max")
    parser.add_argument("--lora-steps", type=int, default=2,
                        help="timed LoRA finetune steps at ADGEN's shape after one warm-up (0: skip that table)")
    parser.add_argument("--lora-batch", type=int, default=4)
    parser.add_argument("--json", metavar="FILE", help="also write the decode table's rows to FILE as JSON")
    parser.add_argument("--worker", nargs=2, metavar=("VARIANT", "BATCH"), help=argparse.SUPPRESS)
    parser.add_argument("--lora-worker", nargs=2, metavar=("VARIANT", "BATCH"), help=argparse.SUPPRESS)
    parser.add_argument("--cpp-worker", nargs=2, metavar=("VARIANT", "GGML_FILE"), help=argparse.SUPPRESS)
    parser.add_argument("--write-thudm-dir", metavar="DIR", help=argparse.SUPPRESS)
    return parser


def resolve(args):
    for name, value in PRESETS[args.preset].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def _variants(args) -> list[str] | None:
    """The variants to run; None after a one-line error (a variant asked for whose setup is missing)."""
    code, cpp = os.environ.get("CHATGLM2_CODE"), os.environ.get("CHATGLM_CPP_PYTHON")
    cpp_missing = None
    if not (code and cpp):
        cpp_missing = ("needs CHATGLM_CPP_PYTHON=/python/with/chatglm_cpp and "
                       "CHATGLM2_CODE=/dir/with/modeling_chatglm.py")
    elif not os.access(cpp, os.X_OK):
        cpp_missing = f"needs CHATGLM_CPP_PYTHON to name a Python executable (not {cpp})"
    elif missing := [name for name in THUDM_FILES if not (Path(code) / name).is_file()]:
        cpp_missing = f"needs {', '.join(missing)} in CHATGLM2_CODE ({code}) for its converter"
    elif args.device != "cpu":
        cpp_missing = f"runs on the CPU only (--device {args.device})"
    if args.variants is None:
        variants = [v for v in VARIANTS if (v != "thudm" or code) and (v not in CPP_VARIANTS or not cpp_missing)
                    and (v != "compiled" or args.device != "cpu")]
        if cpp_missing:
            print(f"bench.chatglm2: skipping {', '.join(CPP_VARIANTS)}: chatglm-cpp {cpp_missing}")
        return variants
    if "thudm" in args.variants and not code:
        print("bench.chatglm2: error: the thudm variant needs CHATGLM2_CODE=/dir/with/modeling_chatglm.py",
              file=sys.stderr)
        return None
    if cpp_missing and any(v in CPP_VARIANTS for v in args.variants):
        print(f"bench.chatglm2: error: chatglm-cpp {cpp_missing}", file=sys.stderr)
        return None
    return list(args.variants)


def _run(command, what: str):
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)})
    if done.returncode != 0:
        print(f"bench.chatglm2: {what} failed:\n{done.stderr.strip()[-2000:]}", file=sys.stderr)
        return None
    return done.stdout


def summarize(samples: dict) -> list[dict]:
    """One row per (variant, batch): each figure's median over the rounds, the decode rate's min and max,
    and the tokens of the first round (``na`` where the variant did not run at that batch)."""
    import statistics

    rows = []
    for (variant, batch), results in samples.items():
        if not results:
            rows.append({"variant": variant, "batch": batch, "na": True})
            continue
        rates = [r["decode_tok_s"] for r in results]
        rows.append({
            "variant": variant, "batch": batch, "tokens": results[0]["tokens"],
            "ttft_ms": statistics.median(r["ttft_ms"] for r in results),
            "decode_tok_s": statistics.median(rates), "decode_min": min(rates), "decode_max": max(rates),
            "peak_mib": statistics.median(r["peak_mib"] for r in results),
            "bound": statistics.median(r.get("bound", float("nan")) for r in results),
            "compile_s": statistics.median(r.get("compile_s", float("nan")) for r in results),
            "stable_tokens": all(r["tokens"] == results[0]["tokens"] for r in results),
        })
    return rows


def _same_tokens(row: dict, rows: list[dict]) -> float | None:
    """The share of row 0's tokens equal to glm_port's at the same batch (None where either did not run)."""
    ref = next((r for r in rows if r["variant"] == "glm_port" and r["batch"] == row["batch"] and not r.get("na")),
               None)
    if ref is None or row.get("na"):
        return None
    return sum(a == b for a, b in zip(row["tokens"], ref["tokens"])) / len(ref["tokens"])


def print_decode_table(rows: list[dict], rounds: int = 1) -> None:
    """The decode table; ratios are of medians, against glm_port, transformers and THUDM at the same batch."""
    def rate_of(variant, batch):
        return next((r for r in rows if r["variant"] == variant and r["batch"] == batch and not r.get("na")), None)

    spread = rounds > 1
    print(f"{'variant':<15} {'batch':>5} {'ttft ms':>9} {'decode tok/s':>13} " + (f"{'min-max':>11} " if spread else "")
          + f"{'bound %':>8} {'compile s':>10} "
          + f"{'peak MiB':>9} {'same tokens':>12} {'vs glm_port':>12} {'vs transformers':>16} {'vs thudm':>9}")
    for row in rows:
        if row.get("na"):
            print(f"{row['variant']:<15} {row['batch']:>5} {'n/a':>9} {'n/a':>13} " + (f"{'n/a':>11} " if spread else "")
                  + f"{'n/a':>8} {'n/a':>10} {'n/a':>9} {'n/a':>12} {'n/a':>12} {'n/a':>16} {'n/a':>9}")
            continue
        bound, compile_s = row.get("bound", float("nan")), row.get("compile_s", float("nan"))
        extra = (f"{100 * bound:>8.1f} " if bound == bound else f"{'n/a':>8} ") + (
            f"{compile_s:>10.1f} " if compile_s == compile_s else f"{'-':>10} ")
        ref = rate_of("glm_port", row["batch"]) or row
        same = f"{sum(a == b for a, b in zip(row['tokens'], ref['tokens']))}/{len(ref['tokens'])}"
        if not row["stable_tokens"]:
            same += "*"  # the rounds did not all give the same tokens
        ratios = [f"{row['decode_tok_s'] / other['decode_tok_s']:.2f}x" if other else "n/a"
                  for other in (ref, rate_of("transformers", row["batch"]), rate_of("thudm", row["batch"]))]
        span = f"{row['decode_min']:.1f}-{row['decode_max']:.1f}"
        print(f"{row['variant']:<15} {row['batch']:>5} {row['ttft_ms']:>9.1f} {row['decode_tok_s']:>13.1f} "
              + (f"{span:>11} " if spread else "") + extra
              + f"{row['peak_mib']:>9.1f} {same:>12} {ratios[0]:>12} {ratios[1]:>16} {ratios[2]:>9}")
    if any(not r.get("na") and not r["stable_tokens"] for r in rows):
        print("* the rounds of this row did not all give the same tokens (the column counts the first round's)")


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = resolve(build_parser().parse_args(argv))
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args)))
        return 0
    if args.lora_worker:
        print(json.dumps(lora_worker(args.lora_worker[0], int(args.lora_worker[1]), args)))
        return 0
    if args.cpp_worker:
        print(json.dumps(cpp_worker(args.cpp_worker[0], args.cpp_worker[1], args)))
        return 0
    if args.write_thudm_dir:
        write_thudm_directory(args, args.write_thudm_dir)
        return 0
    print_cpu_line()
    variants = _variants(args)
    if variants is None:
        return 2
    from tqdm import tqdm

    print(f"shape: {args.layers} layers, hidden {args.hidden}, {args.heads} heads x {args.kv_channels} "
          f"({args.groups} kv groups), ffn {args.ffn}, vocab {args.vocab}; prompt {args.prompt}, "
          f"{args.new_tokens} new tokens, greedy; {args.device} {args.dtype}")
    samples, lora_rows = {}, []  # (variant, batch) -> one worker result per round
    runs = [("--worker", v, b) for _ in range(args.rounds) for b in args.batches for v in variants]
    if args.lora_steps > 0:
        runs += [("--lora-worker", v, args.lora_batch) for v in variants if v in LORA_TARGETS]
    with tempfile.TemporaryDirectory(prefix="bench-chatglm2-") as scratch:
        thudm_dir = Path(scratch) / "thudm"
        for flag, variant, batch in tqdm(runs, desc="runs", leave=False):
            if variant in CPP_VARIANTS:
                if batch != 1:
                    samples.setdefault((variant, batch), [])
                    continue
                ggml = Path(scratch) / f"{variant}.bin"  # converted once, kept for the later rounds
                if not thudm_dir.exists() and _run(
                        [sys.executable, "-m", "bench.chatglm2", *argv, "--write-thudm-dir", str(thudm_dir)],
                        "writing the THUDM directory") is None:
                    return 1
                if not ggml.exists() and _run(
                        [os.environ["CHATGLM_CPP_PYTHON"], "-m", "chatglm_cpp.convert", "-i", str(thudm_dir),
                         "-t", CPP_VARIANTS[variant], "-o", str(ggml)], f"chatglm-cpp's convert to {variant}") is None:
                    return 1
                out = _run([os.environ["CHATGLM_CPP_PYTHON"], "-m", "bench.chatglm2", *argv,
                            "--cpp-worker", variant, str(ggml)], f"{variant} batch {batch}")
            else:
                out = _run([sys.executable, "-m", "bench.chatglm2", *argv, flag, variant, str(batch)],
                           f"{variant} batch {batch}")
            if out is None:
                return 1
            result = json.loads(out.strip().splitlines()[-1])
            if flag == "--worker":
                samples.setdefault((variant, batch), []).append(result)
            else:
                lora_rows.append(result)
    rows = summarize(samples)
    print_decode_table(rows, args.rounds)
    if args.json:
        Path(args.json).write_text(json.dumps([{k: v for k, v in row.items() if k != "tokens"} | {
            "same_tokens": _same_tokens(row, rows)} for row in rows], indent=1), encoding="utf-8")
    if lora_rows:
        print(f"\nLoRA finetune (rank 8, alpha 32, dropout 0.1; AdamW), ADGEN shape 64 + 128 + 1, batch {args.lora_batch}, "
              f"{args.lora_steps} timed steps:")
        print(f"{'variant':<15} {'samples/s':>10} {'first loss':>11}")
        for row in lora_rows:
            print(f"{row['variant']:<15} {row['samples_s']:>10.2f} {row['loss']:>11.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
