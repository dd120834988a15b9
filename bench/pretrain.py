"""GLM pretraining speed, side by side: the original upstream under glm-mock, the migrated upstream, glm_port.

    python -m bench.pretrain                                   # glm_port alone, CPU shapes tiny and base
    python -m bench.pretrain --upstream /path/to/GLM           # all three, CPU shapes tiny and base
    python -m bench.pretrain --upstream /path/to/GLM --shapes large --precisions fp32 half   # GPU: GLM-Large

Every run is a fresh process training the same GLM with the same flags for ``--iters`` iterations:
(a) upstream's ``pretrain_glm.py`` unmodified under ``glm-mock``; (b) the tree ``glm-migrate`` makes
of it, with no mock; (c) ``glm-pretrain``. All three read upstream's ``--train-data test`` corpus
(where the checkout's ``TestDataset.PATH`` says; without ``--upstream``, the same corpus written into
``--workdir``, or ``--corpus``) with the BERT WordPiece vocabulary (``--vocab`` or ``$GLM_VOCAB``, 30522
tokens, padded to 30592) and print
upstream's ``elapsed time per iteration (ms)`` line, which is parsed; the figure per run is the median
after ``--warmup`` iterations. Peak memory is the child's RSS high-water mark (``VmHWM``) on CPU and
``torch.cuda.max_memory_allocated`` on a GPU (bench/peak_memory.py wraps each run). With ``--rounds``
above 1 the three alternate (the order rotates every round) and each figure is the median over rounds,
which is what to use on a loaded machine.

``half`` precision is upstream's ``--fp16`` (apex-style FP16 module, loss scaling: the only half mode
upstream has) and glm_port's ``--bf16`` autocast. Upstream's dynamic loss scale starts at 2^32 and halves
on each overflow, skipping that optimizer step; an iteration whose logged loss scale fell is left out of
the median and counted under the table (on a GPU the defaults, 40 iterations after 20, let it settle).
MFU (on a GPU) counts ``6 N + 12 L h s`` FLOP per token (N: parameters in the matmuls, the tied output
layer included) against ``--peak-tflops``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

import harness  # upstream's corpus, vocabulary, flags and environments
import shim as torch
from bench._measure import print_cpu_line

ROOT = Path(__file__).resolve().parents[1]
PEAK_MEMORY = ROOT / "bench" / "peak_memory.py"
ELAPSED = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")
LOSS_SCALE = re.compile(r"loss scale ([0-9.]+)")
LOSS = re.compile(r"lm loss ([-+0-9.eE]+|nan|inf)")
PEAK = re.compile(r"peak memory \(MiB\): rss ([0-9.]+) \| cuda ([0-9.]+|-)")
PADDED_VOCAB = 30592  # BERT's 30522 rounded up to a multiple of 128, as upstream and glm_port pad it
RUNNERS = ("original", "migrated", "glm_port")
TITLES = {"original": "(a) original + glm-mock", "migrated": "(b) migrated upstream", "glm_port": "(c) glm_port"}


@dataclass(frozen=True)
class Shape:
    name: str
    layers: int
    hidden: int
    heads: int
    seq: int
    batches: tuple[int, ...]

    def flops_per_token(self) -> float:
        """Model FLOP per trained token: 6 per matmul parameter (forward + backward) plus attention."""
        matmul_params = 12 * self.layers * self.hidden**2 + self.hidden * PADDED_VOCAB
        return 6.0 * matmul_params + 12.0 * self.layers * self.hidden * self.seq


SHAPES = {
    "tiny": Shape("tiny", layers=2, hidden=64, heads=4, seq=128, batches=(4,)),
    "base": Shape("base", layers=6, hidden=256, heads=8, seq=256, batches=(8,)),
    "large": Shape("large", layers=24, hidden=1024, heads=16, seq=512, batches=(8, 16)),  # GLM-Large
}


@dataclass(frozen=True)
class Case:
    shape: Shape
    batch: int
    precision: str  # "fp32" or "half"

    @property
    def label(self) -> str:
        return f"{self.shape.name} b{self.batch} {self.precision}"

    def common_flags(self, iters: int) -> list[str]:
        """Flags upstream and glm-pretrain share, meaning the same in both."""
        s = self.shape
        return [
            "--num-layers", str(s.layers), "--hidden-size", str(s.hidden), "--num-attention-heads", str(s.heads),
            "--seq-length", str(s.seq), "--max-position-embeddings", str(s.seq), "--batch-size", str(self.batch),
            "--train-iters", str(iters), "--lr", "1e-3", "--lr-decay-style", "cosine", "--warmup", "0.05",
            "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--bert-prob", "1.0", "--seed", "1234",
            "--log-interval", "1",
        ]  # fmt: skip


@dataclass
class Run:
    code: int
    ms: list[float]
    losses: list[float]
    peak_mib: float
    log: Path
    skipped: list[bool] = field(default_factory=list)  # per iteration: its optimizer step was skipped

    def median_ms(self, warmup: int) -> float:
        steady = [ms for ms, skipped in zip(self.ms[warmup:], self.skipped[warmup:]) if not skipped]
        steady = steady or self.ms[warmup:] or self.ms
        return statistics.median(steady) if steady else float("nan")

    def skipped_after(self, warmup: int) -> int:
        return sum(self.skipped[warmup:])


def iteration_times(text: str) -> tuple[list[float], list[bool]]:
    """Each logged iteration's ms, and whether it skipped its optimizer step: its loss scale (fp16 runs)
    fell below the previous line's, which upstream's dynamic scaler does only on an overflow."""
    times, skipped, scale = [], [], None
    for line in text.splitlines():
        elapsed = ELAPSED.search(line)
        if elapsed is None:
            continue
        logged = LOSS_SCALE.search(line)
        new_scale = float(logged[1]) if logged else None
        skipped.append(None not in (scale, new_scale) and new_scale < scale)
        times.append(float(elapsed[1]))
        scale = new_scale if new_scale is not None else scale
    return times, skipped


@dataclass
class Measured:
    runs: list[Run] = field(default_factory=list)

    def ok(self) -> bool:
        return bool(self.runs) and all(r.code == 0 and r.ms for r in self.runs)

    def ms(self, warmup: int) -> float:
        return statistics.median(r.median_ms(warmup) for r in self.runs)

    def peak(self) -> float:
        return statistics.median(r.peak_mib for r in self.runs)


class Bench:
    def __init__(self, args, cuda: bool):
        self.args, self.cuda = args, cuda
        self.workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="glm-bench-"))).resolve()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.trees: dict[str, Path] = {}
        if args.upstream is not None:
            from harness import verify  # the e2e check's runner: a runnable copy and its migration

            self.trees["original"], self.trees["migrated"] = verify.prepare(
                args.upstream.resolve(), self.workdir, args.vocab
            )
            self.envs = {"original": harness.mock_env(""), "migrated": harness.ported_env()}
            self.corpus = harness.corpus_path(self.trees["original"])  # where upstream reads it
        else:  # glm_port alone still reads upstream's corpus, written the way the harness writes it
            self.corpus = corpus_for(args, self.workdir)
        self.vocab = args.vocab

    def runners(self) -> list[str]:
        return [r for r in RUNNERS if r == "glm_port" or r in self.trees]

    def command(self, runner: str, case: Case) -> tuple[list[str], Path, dict]:
        flags = case.common_flags(self.args.iters)
        threads = {"OMP_NUM_THREADS": str(self.args.threads)} if self.args.threads else {}
        if runner == "glm_port":
            flags += ["--train-data", str(self.corpus), "--tokenizer-type", "BertWordPieceTokenizer",
                      "--tokenizer-path", str(self.vocab)]  # fmt: skip
            flags += ["--bf16"] if case.precision == "half" else []
            flags += shlex.split(self.args.glm_port_flags)
            env = {**os.environ, "GLM_MOCK_DISABLE": "1", **threads}
            return [sys.executable, str(PEAK_MEMORY), "-m", "glm_port.pretrain_glm", *flags], ROOT, env
        # Upstream's own flags first; the shared ones after override its sizes (argparse keeps the last).
        flags = [*harness.PRETRAIN_FLAGS, *flags, *(["--fp16"] if case.precision == "half" else [])]
        # The selfcheck's gloo would carry upstream's DDP all-reduce through host memory on a GPU.
        flags += ["--distributed-backend", "nccl"] if self.cuda else []
        env = {**self.envs[runner], "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(harness.free_port()), **threads}  # fmt: skip
        return [sys.executable, str(PEAK_MEMORY), "pretrain_glm.py", *flags], self.trees[runner], env

    def run(self, runner: str, case: Case, round_: int) -> Run:
        cmd, cwd, env = self.command(runner, case)
        log = self.workdir / f"{runner}.{case.label.replace(' ', '_')}.{round_}.log"
        try:
            proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, timeout=self.args.timeout)  # fmt: skip
            code, text = proc.returncode, proc.stdout
        except subprocess.TimeoutExpired as exc:
            code, text = -1, (exc.stdout or b"").decode(errors="replace") + f"\n[timed out after {self.args.timeout} s]"
        log.write_text(f"$ cd {cwd} && {' '.join(cmd)}\n{text}", encoding="utf-8")
        peak = PEAK.findall(text)
        peak_mib = float("nan")
        if peak:
            rss, cuda = peak[-1]
            peak_mib = float(cuda) if self.cuda and cuda != "-" else float(rss)
        times, skipped = iteration_times(text)
        return Run(code, times, [float(x) for x in LOSS.findall(text)], peak_mib, log, skipped)


def report(case: Case, results: dict[str, Measured], args, cuda: bool) -> str:
    tokens = case.batch * case.shape.seq
    memory = "peak GPU MiB" if cuda else "peak RSS MiB"
    head = f"| {case.label} | ms/iter | samples/s | tokens/s | {memory} |" + (" MFU |" if cuda else "")
    head += " speed vs (a) | memory vs (a) | lm loss first -> last |"
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    base = results.get("original")
    for runner, measured in results.items():
        if not measured.ok():
            failed = next((r for r in measured.runs if r.code != 0 or not r.ms), None)
            lines.append(f"| {TITLES[runner]} | failed (exit {failed.code}, log {failed.log}) |")
            continue
        ms = measured.ms(args.warmup)
        rate = 1e3 / ms
        peak = measured.peak()  # nan where the run printed no peak line (its log says why)
        row = (f"| {TITLES[runner]} | {ms:.1f} | {case.batch * rate:.2f} | {tokens * rate:.0f} | "
               f"{'-' if math.isnan(peak) else f'{peak:.0f}'} |")
        if cuda:
            row += f" {tokens * rate * case.shape.flops_per_token() / (args.peak_tflops * 1e12):.1%} |"
        if base is not None and base.ok():
            ratio = peak / base.peak()
            row += f" {base.ms(args.warmup) / ms:.2f}x | {'-' if math.isnan(ratio) else f'{ratio:.2f}x'} |"
        else:
            row += " - | - |"
        losses = measured.runs[0].losses
        row += f" {losses[0]:.4f} -> {losses[-1]:.4f} |" if losses else " - |"
        lines.append(row)
    for runner, measured in results.items():
        skipped = sum(r.skipped_after(args.warmup) for r in measured.runs)
        if skipped:
            lines.append(f"{TITLES[runner]}: {skipped} timed iteration(s) skipped their optimizer step (fp16 "
                         f"overflow) and are left out; a larger --warmup lets the loss scale settle first")
    return "\n".join(lines)


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """``--vocab`` and ``--corpus``, checked by :func:`resolve_data` after parsing."""
    parser.add_argument("--vocab", type=Path, metavar="PATH",
                        help=f"BERT's {harness.VOCAB_NAME}, or a directory holding it (default: ${harness.VOCAB_ENV}; "
                        "with --upstream, also the checkout's own)")
    parser.add_argument("--corpus", type=Path, metavar="PATH",
                        help="JSON lines {\"prompt\", \"text\"} for glm_port (default: upstream's --train-data test "
                        "corpus, written from the vocabulary as the harness writes it)")


def resolve_data(parser: argparse.ArgumentParser, args, checkout: Path | None = None) -> None:
    """``args.vocab`` becomes the vocabulary file (``--vocab``, ``$GLM_VOCAB`` or the checkout's); a
    one-line usage error (exit 2) when there is none, or when ``--corpus`` names no file."""
    try:
        args.vocab = harness.find_vocab(args.vocab, checkout)
    except harness.HarnessError as exc:
        parser.error(str(exc))
    if args.corpus is not None and not args.corpus.is_file():
        parser.error(f"--corpus {args.corpus}: no such file")


def corpus_for(args, directory: Path) -> Path:
    """``--corpus``, else upstream's test corpus written into ``directory`` (seeded: the same bytes
    the harness writes where upstream reads it)."""
    return args.corpus or harness.ensure_corpus(args.vocab, Path(directory) / "test.json")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description="Train the same GLM with (a) the original upstream under glm-mock, (b) the migrated upstream "
        "and (c) glm_port, and print samples/s, tokens/s, peak memory (and MFU on a GPU) with the ratios to (a).",
        epilog="CPU shapes: tiny (2 layers, hidden 64, 4 heads, seq 128, batch 4), base (6 layers, hidden 256, "
        "8 heads, seq 256, batch 8). GPU shape: large = GLM-Large (24 layers, hidden 1024, 16 heads, seq 512, "
        "batch 8 and 16). Logs of every run stay in --workdir.",
    )
    parser.add_argument("--upstream", type=Path, metavar="GLM",
                        help="THUDM/GLM checkout (copied, never modified); without it only glm_port runs")
    add_data_arguments(parser)
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES),
                        help="model shapes (default: tiny base on CPU, large on a GPU)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", help="override the shapes' batch sizes")
    parser.add_argument("--precisions", nargs="+", choices=("fp32", "half"),
                        help="fp32, and/or half = upstream --fp16 vs glm_port --bf16 (default: fp32 on CPU, "
                        "both on a GPU)")
    parser.add_argument("--runners", nargs="+", choices=RUNNERS, default=list(RUNNERS),
                        help="which of the three to run (those needing --upstream are skipped without it)")
    parser.add_argument("--iters", type=int, help="training iterations per run (default 8 on CPU, 40 on a GPU)")
    parser.add_argument("--warmup", type=int,
                        help="first iterations left out of the median (default 2 on CPU, 20 on a GPU, where "
                        "upstream's fp16 loss scale first falls from 2^32, skipping steps)")
    parser.add_argument("--rounds", type=int, default=1, help="alternating repetitions of every run (default 1)")
    parser.add_argument("--threads", type=int, default=None,
                        help="OMP_NUM_THREADS for every run (default: 1 on CPU, as the selfcheck runs upstream)")
    parser.add_argument("--peak-tflops", type=float, default=790.0,
                        help="the GPU's dense bf16 TFLOP/s for MFU (default 790, an H100 SXM as measured)")
    parser.add_argument("--glm-port-flags", default="", metavar="FLAGS",
                        help="extra glm-pretrain flags for (c), one string with '=': --glm-port-flags=\"--checkpoint-activations\"")
    parser.add_argument("--timeout", type=int, default=1800, help="seconds allowed per run")
    parser.add_argument("--workdir", type=Path, help="scratch directory for the trees and logs")
    parser.add_argument("--json", type=Path, metavar="FILE",
                        help="also write every (case, runner) figure to FILE as JSON (bench/gpu.py reads it)")
    args = parser.parse_args(argv)
    if args.upstream is not None and not (args.upstream / "pretrain_glm.py").is_file():
        parser.error(f"--upstream {args.upstream} is not a THUDM/GLM checkout (no pretrain_glm.py)")
    if args.upstream is not None and args.corpus is not None:
        parser.error("--corpus cannot go with --upstream: upstream reads its own --train-data test corpus")
    resolve_data(parser, args, args.upstream)
    cuda = torch.cuda.is_available()
    args.iters = args.iters if args.iters is not None else 40 if cuda else 8
    args.warmup = args.warmup if args.warmup is not None else 20 if cuda else 2
    if args.iters <= args.warmup:
        parser.error(f"--iters {args.iters} must exceed --warmup {args.warmup}")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    cuda = torch.cuda.is_available()
    args.shapes = args.shapes or (["large"] if cuda else ["tiny", "base"])
    args.precisions = args.precisions or (["fp32", "half"] if cuda else ["fp32"])
    if args.threads is None and not cuda:
        args.threads = 1
    bench = Bench(args, cuda)
    runners = [r for r in bench.runners() if r in args.runners]
    cases = [Case(SHAPES[s], b, p) for s in args.shapes for b in (args.batch_sizes or SHAPES[s].batches)
             for p in args.precisions]  # fmt: skip
    print_cpu_line()
    device = torch.cuda.get_device_name() if cuda else f"CPU, {os.cpu_count()} cores, OMP_NUM_THREADS={args.threads}"
    print(f"{device}; torch {torch.__version__}; {args.iters} iterations per run, median after {args.warmup}, "
          f"{args.rounds} round(s); logs in {bench.workdir}")  # fmt: skip
    if args.glm_port_flags:
        print(f"(c) glm_port runs with the extra flags: {args.glm_port_flags}")
    jobs = [(case, round_, runner) for case in cases for round_ in range(args.rounds)
            for runner in runners[round_ % len(runners):] + runners[:round_ % len(runners)]]  # fmt: skip
    results = {case: {r: Measured() for r in runners} for case in cases}
    start = time.perf_counter()
    for case, round_, runner in tqdm(jobs, desc="pretrain bench", unit="run"):
        results[case][runner].runs.append(bench.run(runner, case, round_))
        if all(len(m.runs) == args.rounds for m in results[case].values()):  # the case is complete
            tqdm.write("\n" + report(case, results[case], args, cuda))
    print(f"\n{len(jobs)} runs in {time.perf_counter() - start:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(figures(results, args, cuda), indent=1), encoding="utf-8")


def figures(results: dict, args, cuda: bool) -> list[dict]:
    """Every (case, runner) as a record: what the tables print, for a script to read."""
    records = []
    for case, by_runner in results.items():
        tokens = case.batch * case.shape.seq
        for runner, measured in by_runner.items():
            record = {"shape": case.shape.name, "batch": case.batch, "precision": case.precision,
                      "runner": runner, "ok": measured.ok()}
            if measured.ok():
                ms = measured.ms(args.warmup)
                losses = measured.runs[0].losses
                record.update(ms=ms, peak_mib=measured.peak(), first_loss=losses[0] if losses else None,
                              last_loss=losses[-1] if losses else None,
                              mfu=tokens * 1e3 / ms * case.shape.flops_per_token() / (args.peak_tflops * 1e12)
                              if cuda else None)
            records.append(record)
    return records


if __name__ == "__main__":
    main()
