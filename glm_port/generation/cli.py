"""``glm-generate``: fill blanks / continue text with any model family glm_port has, from released weights.

    glm-generate --model glm-10b "Ng is an adjunct professor at [MASK] (he used to be the Director of AI Lab)."
    glm-generate --model ckpt --json --input prompts.jsonl --num-beams 4 --max-new-tokens 32
    echo "Beijing is the capital of" | glm-generate --model ckpt --do-sample --top-p 0.9 --seed 1
    torchrun --nproc_per_node 2 -m glm_port.generate --tensor-parallel-size 2 --model glm-10b "..."
    torchrun --nproc_per_node 4 -m glm_port.generate --tensor-parallel-size 2 --pipeline-parallel-size 2 --model glm-10b "..."

The family (GLM, ...) comes from the directory's ``config.json`` (``model_type``) through
``glm_port.models``' registry; a directory without one (upstream ``mp_rank_XX`` files, a ``glm-pretrain
--save`` directory) is GLM. Results go to stdout, one per prompt (per returned sequence): as text, or with
``--json`` one JSON object a line. Tokens/s and the time to the first token go to stderr at the end.
Bad input is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from glm_port.dtypes import METAVAR as DTYPE_METAVAR
from glm_port.dtypes import dtype_argument
from glm_port.generation.options import add_quantize_arguments
from glm_port.generation.text import bad_utf8, tolerant_stdin



def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="glm-generate",
        description="Fill blanks / continue text with a model glm_port has (GLM, ...), from released weights.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Prompts: arguments, --input FILE (one per line, or JSON lines with a \"prompt\" field; '-' is\n"
               "stdin), or stdin when it is not a terminal. GLM prompts may hold [MASK], [sMASK] or [gMASK]\n"
               "blanks, filled left to right; a prompt with none is continued ([gMASK] appended).\n\n"
               "examples:\n" + "\n".join("  " + line.strip() for line in __doc__.split("\n\n")[1].splitlines()))
    parser.add_argument("prompts", nargs="*", help="prompts to complete (default: --input, else stdin)")
    parser.add_argument("--model", required=True, metavar="DIR",
                        help="weights: a Hugging Face GLM directory, upstream mp_rank_XX_model_states.pt files "
                             "(any model-parallel size), or a glm-pretrain --save directory")
    parser.add_argument("--input", metavar="FILE",
                        help="read prompts from FILE, UTF-8 ('-': stdin; default: the arguments, else stdin when it "
                             "is not a terminal)")
    parser.add_argument("--json", action="store_true",
                        help="one JSON object per result: prompt, text, generated_ids (per blank), marked, sequence "
                             "(default: the marked form and the plain text)")
    parser.add_argument("--ptuning_checkpoint", "--ptuning-checkpoint", metavar="DIR", default=None,
                        help="ChatGLM2 family: a P-Tuning v2 checkpoint (THUDM ptuning/'s output) run on --model, "
                             "its base (default: none)")
    parser.add_argument("--tokenizer-type", default=None,
                        help="vocabulary type as glm-pretrain takes it (default: read beside the weights, else "
                             "glm-pretrain's built-in tokenizer)")
    parser.add_argument("--tokenizer-path", default=None,
                        help="vocabulary file or directory (default: the one beside the weights)")
    search = parser.add_argument_group("search (transformers' GenerationMixin)")
    search.add_argument("--max-new-tokens", type=int, default=64,
                        help="tokens per blank at most, at least 1 (default 64; GLM: at most the model's positions "
                             "- 1, ChatGLM2: cut to what fits seq_length)")
    search.add_argument("--min-new-tokens", type=int, default=None,
                        help="no end token before this many, at most --max-new-tokens (default: none)")
    search.add_argument("--do-sample", action="store_true", help="sample instead of greedy / beam search "
                        "(default: greedy, or beam search with --num-beams > 1)")
    search.add_argument("--temperature", type=float, default=None,
                        help="with --do-sample: divide the logits by this, > 0 (default: 1.0, transformers' "
                             "default); 0 means greedy")
    search.add_argument("--top-k", type=int, default=None,
                        help="with --do-sample: sample among the k likeliest tokens, >= 0, 0 = all (default: "
                             "transformers' 50)")
    search.add_argument("--top-p", type=float, default=None,
                        help="with --do-sample: sample in the smallest set of tokens whose probability reaches p, "
                             "in (0, 1] (default: 1.0, no cut)")
    search.add_argument("--seed", type=int, default=None, help="random seed for sampling (default: none, "
                        "a different draw each run)")
    search.add_argument("--num-beams", type=int, default=1, help="beam search with this many beams (default 1: none)")
    search.add_argument("--length-penalty", type=float, default=None,
                        help="beam score / length ** this (default: transformers' 1.0)")
    search.add_argument("--repetition-penalty", type=float, default=None,
                        help="transformers' repetition penalty over the prompt and the text so far, > 0; 1 is off "
                             "(default: off)")
    search.add_argument("--stop", action="append", default=None, metavar="TEXT",
                        help="end a continuation at this text, which is cut off with what follows (repeatable; "
                             "ChatGLM2 family; default: none)")
    search.add_argument("--no-repeat-ngram-size", type=int, default=None,
                        help="no n-gram of this size twice, >= 1 (default: off)")
    search.add_argument("--num-return-sequences", type=int, default=1,
                        help="results per prompt, one-blank prompts (default 1)")
    search.add_argument("--no-cache", action="store_true",
                        help="recompute the whole prefix every step, slow (default: a key/value cache)")
    search.add_argument("--static-cache", action="store_true",
                        help="preallocate the KV cache (transformers' StaticCache) instead of growing it "
                             "(default: grow it)")
    run = parser.add_argument_group("where it runs")
    run.add_argument("--dtype", type=dtype_argument, metavar=DTYPE_METAVAR, default="fp32",
                     help="weights and compute precision (default fp32; torch's float32, bfloat16, float16 too)")
    run.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: the accelerator if any)")
    run.add_argument("--batch-size", type=int, default=8, help="prompts per generate call (default 8)")
    run.add_argument("--no-pack", action="store_true",
                     help="on CPU, keep the linear weights as loaded (default: repack each weight shape into "
                          "oneDNN's layout where that measures faster for a decode step; docs/generation.md)")
    add_quantize_arguments(run)
    run.add_argument("--tensor-parallel-size", type=int, default=1,
                     help="split every layer over this many ranks, launched with torchrun (default 1)")
    run.add_argument("--pipeline-parallel-size", type=int, default=1,
                     help="split the layers into this many stages, each stage's layers split over "
                          "--tensor-parallel-size ranks, launched with torchrun (default 1)")
    run.add_argument("--pipeline-num-layers", type=int, default=None,
                     help="layers the pipeline splits (LiBai's fourth number; default: all of the model's)")
    return parser


class UsageError(ValueError):
    """Bad input: reported as one line, exit status 2."""


def read_prompts(args) -> list[str]:
    lines: list[tuple[str, str]] = [(f"argument {i + 1}", p) for i, p in enumerate(args.prompts)]
    source = args.input
    if source is None and not args.prompts and not sys.stdin.isatty():
        source = "-"
    if source is not None:
        if source == "-":
            text, name = tolerant_stdin().read(), "stdin"
        else:
            try:  # undecodable bytes kept as surrogates, reported below with their line
                text, name = Path(source).read_bytes().decode("utf-8", errors="surrogateescape"), source
            except OSError as error:
                raise UsageError(f"--input {source}: {error.strerror or error}") from None
        for number, line in enumerate(text.splitlines(), 1):
            if line.strip():
                lines.append((f"{name} line {number}", line))
    prompts = []
    for where, line in lines:
        bad = bad_utf8(line)
        if bad is not None:
            raise UsageError(f"{where}: not valid UTF-8 ({bad})")
        if line.lstrip().startswith("{"):
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise UsageError(f"{where}: not valid JSON ({error.msg})") from None
            prompt = record.get("prompt", record.get("text")) if isinstance(record, dict) else None
            if not isinstance(prompt, str):
                raise UsageError(f"{where}: a JSON line needs a \"prompt\" string")
            line = prompt
        prompts.append(line)
    if not prompts:
        raise UsageError("no prompts: give them as arguments, with --input FILE, or on stdin")
    return prompts


def check_search(args) -> None:
    """Every search option in its range, before anything is loaded (UsageError, one line)."""
    for name in ("max_new_tokens", "batch_size", "num_beams", "num_return_sequences", "tensor_parallel_size",
                 "pipeline_parallel_size"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    checks = [  # (flag, value, in range, the range)
        ("--min-new-tokens", args.min_new_tokens, lambda v: 0 <= v <= args.max_new_tokens,
         f"between 0 and --max-new-tokens ({args.max_new_tokens})"),
        ("--temperature", args.temperature, lambda v: 0 <= v < float("inf"), "a number >= 0 (0: greedy)"),
        ("--top-p", args.top_p, lambda v: 0 < v <= 1, "in (0, 1]"),
        ("--top-k", args.top_k, lambda v: v >= 0, "at least 0 (0: no cut)"),
        ("--length-penalty", args.length_penalty, lambda v: abs(v) < float("inf"), "a finite number"),
        ("--no-repeat-ngram-size", args.no_repeat_ngram_size, lambda v: v >= 0, "at least 0 (0: off)"),
        ("--pipeline-num-layers", args.pipeline_num_layers, lambda v: v >= 1, "at least 1"),
        ("--repetition-penalty", args.repetition_penalty, lambda v: 0 < v < float("inf"), "a number > 0 (1: off)"),
    ]
    for flag, value, ok, expected in checks:
        if value is not None and not ok(value):  # NaN fails every comparison: refused too
            raise UsageError(f"{flag} must be {expected}, got {value}")
    for stop in args.stop or []:
        if not stop:
            raise UsageError("--stop must be a non-empty text")
        if bad_utf8(stop) is not None:
            raise UsageError(f"--stop: not valid UTF-8 ({bad_utf8(stop)})")
    from glm_port.models import check_quantize

    problem = check_quantize(args.quantize, args.quantize_group_size)
    if problem is None and args.quantize and (args.tensor_parallel_size > 1 or args.pipeline_parallel_size > 1):
        problem = f"--quantize {args.quantize}: not with --tensor-parallel-size/--pipeline-parallel-size"
    if problem is not None:
        raise UsageError(problem)


def generate_kwargs(args) -> dict:
    """``generate``'s keyword arguments from the flags; ``--temperature 0`` is greedy (as common CLIs take it)."""
    greedy_by_temperature = args.do_sample and args.temperature == 0
    kwargs = {"do_sample": args.do_sample and not greedy_by_temperature, "num_beams": args.num_beams,
              "num_return_sequences": args.num_return_sequences, "use_cache": not args.no_cache}
    if args.static_cache:
        kwargs["cache_implementation"] = "static"
    sampling = () if greedy_by_temperature else ("temperature", "top_k", "top_p")
    for name in (*sampling, "length_penalty", "no_repeat_ngram_size", "min_new_tokens", "repetition_penalty"):
        if getattr(args, name) is not None:
            kwargs[name] = getattr(args, name)
    if args.stop:
        kwargs["stop_strings"] = list(args.stop)
    if args.num_return_sequences > max(args.num_beams, 1) and not kwargs["do_sample"]:
        raise UsageError(f"--num-return-sequences {args.num_return_sequences} needs --num-beams at least as "
                         f"large, or --do-sample")
    return kwargs


def check_features(family, args) -> None:
    """What the flags ask for, against what the family declares it supports (``Family.supports``): anything
    it lacks is refused in one line (``models.Unsupported``) instead of silently ignored."""
    family.require(
        (args.tensor_parallel_size > 1 and f"--tensor-parallel-size {args.tensor_parallel_size}", "tensor_parallel"),
        (args.pipeline_parallel_size > 1 and f"--pipeline-parallel-size {args.pipeline_parallel_size}",
         "pipeline_parallel"),
        (args.static_cache and "--static-cache", "static_cache"),
        (args.quantize and f"--quantize {args.quantize}", "quantize"),
        (args.ptuning_checkpoint and f"--ptuning_checkpoint {args.ptuning_checkpoint}", "prefix_tuning"),
    )
    if args.ptuning_checkpoint and args.static_cache:
        raise UsageError("--ptuning_checkpoint with --static-cache: a P-Tuning prefix runs with a growing cache")
    if args.ptuning_checkpoint and args.tensor_parallel_size > 1:
        raise UsageError(f"--ptuning_checkpoint with --tensor-parallel-size {args.tensor_parallel_size}: a P-Tuning "
                         f"prefix is not split by tensor parallelism")


def detect_family(path):
    """The registry's family for the weights at ``path`` (``config.json``'s ``model_type``; GLM without one)."""
    from glm_port.models import family_at

    try:
        return family_at(path)
    except ValueError as error:
        if type(error) is not ValueError:  # UnknownFamily: reported as it is
            raise
        raise UsageError(str(error)) from None


class FirstTokenClock:
    """A transformers stopping criterion that never stops: it notes when the first new token exists."""

    def __init__(self):
        self.first = None

    def __call__(self, input_ids, scores, **kwargs):
        import shim as torch

        if self.first is None:
            self.first = time.perf_counter()
        return torch.zeros(input_ids.size(0), dtype=torch.bool, device=input_ids.device)


def run(args, out=sys.stdout, err=sys.stderr) -> list[dict]:
    import shim as torch
    from transformers import StoppingCriteriaList

    from shim.nn import pack_linears

    from glm_port.generation.parallel import InferenceParallel

    check_search(args)
    prompts = read_prompts(args)
    kwargs = generate_kwargs(args)
    family = detect_family(args.model)
    if family.generation is None:
        raise UsageError(f"the {family.name} family has no generation")
    check_features(family, args)  # before any process group starts or any weight is read
    backend = family.binding("generation")
    if args.quantize and hasattr(backend, "check_quantize"):  # a group size that does not divide a row
        backend.check_quantize(args.model, args.quantize, args.quantize_group_size)
    parallel = InferenceParallel.from_environment(args.tensor_parallel_size, args.pipeline_parallel_size,
                                                  args.pipeline_num_layers, device=args.device)
    try:
        prefix = {"ptuning_checkpoint": args.ptuning_checkpoint} if args.ptuning_checkpoint else {}
        model, tokenizer = backend.load(args.model, dtype=args.dtype, device=parallel.device,
                                        tokenizer_type=args.tokenizer_type, tokenizer_path=args.tokenizer_path,
                                        tensor_parallel=parallel.model_parallel(), **prefix)
        parallel.seed(args.seed)
        mine = list(parallel.my_prompts(len(prompts)))
        if args.quantize:  # in place of the CPU repacking; a group size not dividing a row: one line, exit 2
            family.quantize(model, args.quantize, args.quantize_group_size)
        elif not args.no_pack and model.device.type == "cpu":
            rows = min(args.batch_size, max(len(mine), 1)) * max(args.num_beams, args.num_return_sequences)
            pack_linears(model, batch_size=rows)
        clock = FirstTokenClock()
        start = time.perf_counter()
        with torch.inference_mode():
            results = backend.generate(model, tokenizer, [prompts[i] for i in mine],
                                       max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                                       stopping_criteria=StoppingCriteriaList([clock]), **kwargs)
        elapsed = time.perf_counter() - start
        per_prompt = len(results) // max(len(mine), 1)
        results = parallel.gather_results([(mine[k // per_prompt], r) for k, r in enumerate(results)])
        if parallel.is_writer:
            for result in results:
                if args.json:
                    out.write(json.dumps(result, ensure_ascii=False) + "\n")
                else:
                    out.write(f"{result['marked']}\n{result['text']}\n\n")
            out.flush()
            if getattr(tokenizer, "load_note", None):  # e.g. GLM weights without a vocabulary: the built-in one
                err.write(f"glm-generate: note: {tokenizer.load_note}\n")
            tokens = sum(len(span) for r in results for span in r["generated_ids"])
            first = (clock.first - start) * 1000 if clock.first else float("nan")
            err.write(f"glm-generate: {len(results)} result(s), {tokens} new tokens in {elapsed:.2f} s: "
                      f"{tokens / max(elapsed, 1e-9):.1f} tokens/s, time to first token {first:.0f} ms\n")
        return results
    finally:
        parallel.close()


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    from glm_port.models import UnknownFamily, WeightsError

    try:
        run(args)
    except (UsageError, WeightsError, UnknownFamily, ValueError, FileNotFoundError) as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"glm-generate: error: {message}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
