"""The GPU goals in one run: training GLM-Large, decoding ChatGLM2-6B and GLM-10B, the gpu tests; one table.

    python -m bench.gpu                                   # on the GPU machine: everything, about 8 minutes
    python -m bench.gpu --parts decode tests              # some of it (train, decode, tests)
    python -m bench.gpu --tiny                            # rehearsal on any machine: tiny shapes, CPU is fine

Each part runs the bench that owns it, in its own processes, and reads the figures it writes (``--json``):

- **train** (``bench.pretrain``, GLM-Large: 24 layers, hidden 1024, seq 512): the original upstream under
  glm-mock (``--fp16`` and fp32) against glm-pretrain as a user runs it (``--bf16``; on a GPU its layers are
  compiled by default) at batch 8, and glm_port bf16 alone at batch 16 and 32 for MFU. Needs a THUDM/GLM
  copy (``--upstream``, default ``.upstream`` beside the repository) and BERT's vocabulary (``--vocab``,
  default ``.vocab/`` or ``$GLM_VOCAB``); without the copy, glm_port's rows alone. Goals (issue 28): bf16 at
  batch 8 >= 3.5x the original's ``--fp16`` iteration rate, fp32 >= 2.5x the original's fp32, bf16 MFU >= 50%
  at batch 16 and >= 55% at batch 32.
- **decode** (``bench.chatglm2`` at ChatGLM2-6B's full 28 layers, ``bench.generate`` at GLM-10B's shape; bf16,
  prompt 512, 128 new tokens, batch 1 and 8): glm_port as loaded, the ``compiled`` variant (static cache, the
  decode step compiled and replayed as a CUDA graph), transformers' eager ``generate`` on the same weights
  (ChatGLM2: transformers' own ``GlmForCausalLM``; GLM-10B has no class in transformers, so glm_port's eager
  cached ``generate`` stands in). Goals at batch 1: >= 60% of the memory-bandwidth bound (weight bytes x
  steps/s over the copy rate measured in the same process) and >= 3x transformers' eager ``generate``.
- **tests**: ``pytest -m gpu`` (tests/gpu) and the tests named as failing on a GPU machine.

Each part's processes get what is left of ``--budget`` seconds (default 480), so the whole run stays inside
one 10-minute command; a part cut short says so in the table. The raw outputs stay in ``--workdir``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._measure import print_cpu_line

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("train", "decode", "tests")
# Named in issue 28 as failing on a GPU machine while passing on CPU.
GPU_FAILURES = (
    "tests/glm_port/chatglm2/test_model.py::test_cache_gives_the_full_forward",
    "tests/shim/test_ops_layer_norm_kernels.py::test_tensor_type_names_the_active_device_as_cuda",
    "tests/shim/test_ops_layer_norm_kernels.py::test_tensor_type_converts_to_cuda_named_types_on_the_active_device",
)
GLM_10B = ["--layers", "48", "--hidden", "4096", "--heads", "64", "--vocab", "50304", "--positions", "1024"]
TINY_GLM = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "1024", "--positions", "256"]


class Clock:
    """What is left of the run's budget, for each child process's timeout."""

    def __init__(self, budget: float):
        self.deadline = time.monotonic() + budget

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())


def python_path() -> str:
    """The repository first, then whatever PYTHONPATH already holds (wheels unpacked beside it on a GPU box)."""
    return os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)


def run(command: list[str], clock: Clock, log: Path, env: dict | None = None) -> tuple[int, str]:
    """Run ``command`` from the repository root within the budget; its output goes to ``log``."""
    timeout = clock.left()
    if timeout < 5:
        log.write_text("not run: the budget was spent\n", encoding="utf-8")
        return -1, "not run: the budget was spent"
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": python_path(), **(env or {})})
        code, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code = -1
        text = "".join(part.decode(errors="replace") if isinstance(part, bytes) else (part or "")
                       for part in (exc.stdout, exc.stderr)) + f"\n[cut at the budget: {timeout:.0f} s]"
    log.write_text(f"$ {' '.join(command)}\n{text}", encoding="utf-8")
    return code, text


def _read(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _row(part, what, figure, goal="", met=None) -> dict:
    return {"part": part, "what": what, "figure": figure, "goal": goal,
            "met": "" if met is None else ("yes" if met else "NO")}


def train(args, clock: Clock, workdir: Path) -> list[dict]:
    shape = ["--shapes", "tiny"] if args.tiny else ["--shapes", "large"]
    iters = ["--iters", "6", "--warmup", "2"] if args.tiny else ["--iters", "30", "--warmup", "10"]
    data = ["--vocab", str(args.vocab)] if args.vocab else []
    upstream = ["--upstream", str(args.upstream)] if args.upstream else []
    rows = []
    first = workdir / "train-b8.json"
    code, _ = run([sys.executable, "-m", "bench.pretrain", *shape, *iters, *data, *upstream,
                   "--batch-sizes", "4" if args.tiny else "8", "--precisions", "half", "fp32",
                   "--runners", *(["original", "glm_port"] if args.upstream else ["glm_port"]),
                   "--workdir", str(workdir / "pretrain"), "--json", str(first)], clock, workdir / "train-b8.log")
    records = _read(first) or []
    by = {(r["precision"], r["runner"]): r for r in records}
    for precision, goal in (("half", 3.5), ("fp32", 2.5)):
        ours, original = by.get((precision, "glm_port")), by.get((precision, "original"))
        label = f"{'tiny b4' if args.tiny else 'GLM-Large b8'} {'bf16 vs --fp16' if precision == 'half' else 'fp32'}"
        if not (ours and ours["ok"]):
            rows.append(_row("train", label, f"glm_port failed or not run (exit {code}; {first.with_suffix('.log')})"))
            continue
        figure = f"{ours['ms']:.1f} ms/iter, {ours['peak_mib']:.0f} MiB"
        if ours.get("mfu") is not None:
            figure += f", MFU {ours['mfu']:.1%}"
        if original and original["ok"]:
            speed = original["ms"] / ours["ms"]
            figure += f"; original {original['ms']:.1f} ms, {original['peak_mib']:.0f} MiB: {speed:.2f}x"
            rows.append(_row("train", label, figure, f">= {goal}x the original", speed >= goal))
        else:
            rows.append(_row("train", label, figure + "; no original run (--upstream)", f">= {goal}x the original"))
    if args.tiny:
        return rows
    mfu = workdir / "train-mfu.json"
    run([sys.executable, "-m", "bench.pretrain", *shape, *iters, *data, "--batch-sizes", "16", "32",
         "--precisions", "half", "--runners", "glm_port", "--workdir", str(workdir / "pretrain"), "--json", str(mfu)],
        clock, workdir / "train-mfu.log")
    records = _read(mfu)
    if records is None:  # cut by the budget or failed: say so rather than leave the goals out of the table
        return rows + [_row("train", f"GLM-Large b{batch} bf16 MFU", "failed or not run (train-mfu.log)",
                            f">= {goal:.0%}") for batch, goal in ((16, 0.50), (32, 0.55))]
    for record in records:
        goal = {16: 0.50, 32: 0.55}.get(record["batch"])
        label = f"GLM-Large b{record['batch']} bf16 MFU"
        if not record["ok"] or record.get("mfu") is None:
            rows.append(_row("train", label, "failed or not run (train-mfu.log)", f">= {goal:.0%}"))
            continue
        rows.append(_row("train", label, f"{record['mfu']:.1%} ({record['ms']:.1f} ms/iter, "
                                         f"{record['peak_mib']:.0f} MiB)", f">= {goal:.0%}", record["mfu"] >= goal))
    return rows


def decode(args, clock: Clock, workdir: Path) -> list[dict]:
    device = "cpu" if args.tiny else "cuda"
    rows = []
    chatglm = workdir / "decode-chatglm2.json"
    shape = ["--preset", "tiny", "--prompt", "32", "--new-tokens", "8"] if args.tiny else [
        "--layers", "28", "--prompt", "512", "--new-tokens", "128"]
    code, _ = run([sys.executable, "-m", "bench.chatglm2", *shape, "--device", device, "--dtype", "bfloat16",
                   "--batches", "1", "8", "--variants", "glm_port", "compiled", "transformers", "--repeats", "1",
                   "--lora-steps", "0", "--json", str(chatglm)], clock, workdir / "decode-chatglm2.log")
    records = _read(chatglm) or []
    name = "tiny ChatGLM2" if args.tiny else "ChatGLM2-6B"
    for batch in (1, 8):
        at = {r["variant"]: r for r in records if r["batch"] == batch and not r.get("na")}
        best = at.get("compiled")
        if best is None:
            rows.append(_row("decode", f"{name} b{batch} compiled", f"failed or not run (exit {code}; "
                                                                       "decode-chatglm2.log)"))
            continue
        reference = at.get("transformers")
        ratio = best["decode_tok_s"] / reference["decode_tok_s"] if reference else float("nan")
        figure = (f"{best['decode_tok_s']:.1f} tok/s ({100 * best['bound']:.0f}% of bound), ttft "
                  f"{best['ttft_ms']:.0f} ms, compile {best['compile_s']:.0f} s; eager glm_port "
                  f"{at['glm_port']['decode_tok_s']:.1f}, transformers "
                  f"{reference['decode_tok_s'] if reference else float('nan'):.1f}: {ratio:.2f}x; same tokens "
                  f"{best.get('same_tokens') or 0:.0%}") if "glm_port" in at else f"{best['decode_tok_s']:.1f} tok/s"
        if batch == 1:
            met = best["bound"] >= 0.6 and ratio >= 3
            rows.append(_row("decode", f"{name} b1 compiled", figure, ">= 60% of bound, >= 3x transformers", met))
        else:
            rows.append(_row("decode", f"{name} b8 compiled", figure))
    glm = GLM_10B if not args.tiny else TINY_GLM
    new = ["--prompts", "32", "--new-tokens", "8"] if args.tiny else ["--prompts", "512", "--new-tokens", "128"]
    for batch in (1, 8):
        out = workdir / f"decode-glm-b{batch}.json"
        code, _ = run([sys.executable, "-m", "bench.generate", *glm, *new, "--batch", str(batch), "--dtype", "bf16",
                       "--device", device, "--variants", "cached,compiled", "--json", str(out)],
                      clock, workdir / f"decode-glm-b{batch}.log")
        result = _read(out)
        label = f"{'tiny GLM' if args.tiny else 'GLM-10B'} b{batch} compiled"
        if not result:
            rows.append(_row("decode", label, f"failed or not run (exit {code}; decode-glm-b{batch}.log)"))
            continue
        at = {r["variant"]: r for r in result["rows"]}
        compiled, cached = at["compiled"], at["cached"]
        share = compiled["tokens_per_s"] / batch / result["bound_tokens_per_s"]
        ratio = compiled["tokens_per_s"] / cached["tokens_per_s"]
        figure = (f"{compiled['tokens_per_s']:.1f} tok/s ({share:.0%} of bound), ttft {compiled['ttft_ms']:.0f} ms, "
                  f"warm-up {compiled['warm_s']:.0f} s; eager cached {cached['tokens_per_s']:.1f}: {ratio:.2f}x; "
                  f"same tokens {'yes' if compiled['same_tokens'] else 'NO'}")
        rows.append(_row("decode", label, figure, ">= 60% of bound, >= 3x eager" if batch == 1 else "",
                         share >= 0.6 and ratio >= 3 if batch == 1 else None))
    return rows


def tests(args, clock: Clock, workdir: Path) -> list[dict]:
    env = {"GLM_GPU_TESTS_DEVICE": "cpu"} if args.tiny else {}
    rows = []
    for label, selection in (("pytest -m gpu (tests/gpu)", ["tests/gpu", "-m", "gpu"]),
                             ("the 3 tests named failing on a GPU", list(GPU_FAILURES))):
        log = workdir / ("tests-gpu.log" if "gpu" in selection else "tests-named.log")
        code, text = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *selection], clock, log, env)
        summary = next((line for line in reversed(text.splitlines()) if " in " in line and (
            "passed" in line or "failed" in line or "skipped" in line or "error" in line)), f"exit {code}")
        rows.append(_row("tests", label, summary.strip("= "), "all pass", code == 0))
    return rows


def print_table(rows: list[dict], header: str) -> None:
    print(header)
    print("| part | what | figure | goal | met |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row['part']} | {row['what']} | {row['figure']} | {row['goal']} | {row['met']} |")


def machine() -> str:
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()}, torch {torch.__version__}, CUDA {torch.version.cuda}"
    return f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores), torch {torch.__version__}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS), help="what to run, in this order")
    parser.add_argument("--budget", type=float, default=480.0, help="seconds for the whole run")
    parser.add_argument("--upstream", type=Path, default=None,
                        help="a THUDM/GLM copy for the original's training rows (default: .upstream if present)")
    parser.add_argument("--vocab", type=Path, default=None,
                        help="BERT's vocabulary (default: .vocab/bert-base-uncased-vocab.txt if present, else "
                             "$GLM_VOCAB)")
    parser.add_argument("--tiny", action="store_true", help="rehearsal: tiny shapes, on the CPU when there is no GPU")
    parser.add_argument("--workdir", type=Path, default=None, help="where the logs and JSON go (default: a new "
                                                                   "temporary directory)")
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    print_cpu_line()
    if args.upstream is None and (ROOT / ".upstream" / "pretrain_glm.py").is_file():
        args.upstream = ROOT / ".upstream"
    if args.vocab is None:
        local = ROOT / ".vocab" / "bert-base-uncased-vocab.txt"
        args.vocab = local if local.is_file() else (Path(os.environ["GLM_VOCAB"]) if os.environ.get("GLM_VOCAB")
                                                     else None)
    if args.vocab is None and "train" in args.parts:
        print("bench.gpu: error: the train part needs BERT's vocabulary: --vocab PATH, .vocab/ or $GLM_VOCAB",
              file=sys.stderr)
        return 2
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="bench-gpu-"))).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    clock, start, rows = Clock(args.budget), time.perf_counter(), []
    for part in args.parts:
        part_start = time.perf_counter()
        rows += {"train": train, "decode": decode, "tests": tests}[part](args, clock, workdir)
        print(f"bench.gpu: {part} done in {time.perf_counter() - part_start:.0f} s", file=sys.stderr, flush=True)
    print_table(rows, f"{machine()}; {time.perf_counter() - start:.0f} s; logs and JSON in {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
