"""Check glm-mock against a THUDM/GLM checkout, which is run unmodified.

    python -m migrate.mock.selfcheck /path/to/GLM [--nproc 1 2] [--iters 20] [--no-mpu-tests]

The checkout is copied to a scratch directory (upstream writes logs beside
itself), its BERT vocabulary is linked where upstream looks for it
(``.pytorch_pretrained_bert/``) if it lacks one, and ``--train-data test`` gets its corpus at the
path upstream hard-codes (``/root/data/test.json``, written only if absent).
Then, with the mock on: ``pretrain_glm.py`` trains a 2-layer, hidden-64 GLM on
CPU in fp32 for each process count, its losses must be finite and falling; and
each ``mpu/tests`` script runs under ``torchrun --nproc_per_node 2``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from migrate.mock import environ as mock_env

CORPUS = Path("/root/data/test.json")  # fixed in upstream's data_utils/corpora.py (TestDataset.PATH)
VOCAB_NAME = "bert-base-uncased-vocab.txt"
DEFAULT_VOCAB = Path(__file__).resolve().parents[3] / "shared" / "vocab" / VOCAB_NAME

# Upstream's own flags (arguments.py), scaled down from config/ds_block_base.sh.
PRETRAIN_FLAGS = [
    "--block-lm", "--bert-prob", "1.0", "--experiment-name", "glm-mock-selfcheck",
    "--model-parallel-size", "1", "--num-layers", "2", "--hidden-size", "64",
    "--num-attention-heads", "4", "--seq-length", "128", "--max-position-embeddings", "128",
    "--batch-size", "4", "--lr", "1e-3", "--lr-decay-style", "cosine", "--warmup", "0.05",
    "--train-data", "test", "--no-lazy-loader", "--split", "949,50,1", "--num-workers", "0",
    "--tokenizer-type", "BertWordPieceTokenizer", "--tokenizer-model-type", "bert-base-uncased",
    "--distributed-backend", "gloo", "--log-interval", "1", "--eval-interval", "100000", "--eval-iters", "2",
    "--save-interval", "100000", "--seed", "1234",
]  # fmt: skip
MPU_TESTS = ["test_cross_entropy.py", "test_data.py", "test_initialize.py", "test_layers.py", "test_random.py"]
# Failures that are upstream's own, on any hardware: the test calls a class its mpu no longer has.
UPSTREAM_DEFECTS = {
    "test_layers.py": "AttributeError: module 'mpu' has no attribute 'BertParallelSelfAttention'",
}
LOSS = re.compile(r"lm loss ([-+0-9.eE]+|nan|inf)")


@dataclass
class Outcome:
    name: str
    status: str  # PASS, FAIL, or UPSTREAM: fails for upstream's own reason, on any hardware
    detail: str
    log: Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prepare_tree(upstream: Path, workdir: Path, vocab: Path) -> Path:
    """A writable copy of the checkout with the vocabulary where upstream reads it."""
    tree = workdir / "GLM"
    if tree.exists():
        shutil.rmtree(tree)
    shutil.copytree(upstream, tree, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    cached = tree / ".pytorch_pretrained_bert" / VOCAB_NAME
    if not cached.exists():  # upstream ships it; some copies leave it out
        if not vocab.is_file():
            raise SystemExit(f"selfcheck: {cached.relative_to(tree)} missing and no vocabulary at {vocab} (give --vocab)")
        cached.parent.mkdir(exist_ok=True)
        cached.symlink_to(vocab.resolve())
    return tree


def ensure_corpus(vocab: Path, path: Path = CORPUS, documents: int = 400) -> None:
    """JSON lines ``{"prompt": "", "text": ...}`` of sentences drawn from the vocabulary, seeded."""
    if path.exists():
        return
    words = [w for w in vocab.read_text(encoding="utf-8").split() if w.isalpha() and len(w) > 2][:3000]
    rng = random.Random(0)
    common = words[:200]  # a skewed distribution the model can learn within 20 steps
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for _ in range(documents):
            sentences = []
            for _ in range(rng.randint(6, 12)):
                n = rng.randint(8, 20)
                sentence = [rng.choice(common) if rng.random() < 0.8 else rng.choice(words) for _ in range(n)]
                sentences.append(" ".join(sentence).capitalize() + ".")
            out.write(json.dumps({"prompt": "", "text": " ".join(sentences)}) + "\n")


def _run(cmd: list[str], cwd: Path, env: dict, log: Path, timeout: int) -> tuple[int, str]:
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True, timeout=timeout)  # fmt: skip
        code, text = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as exc:
        code, text = -1, (exc.stdout or b"").decode(errors="replace") + f"\n[timed out after {timeout} s]"
    log.write_text(f"$ {' '.join(cmd)}\n{text}", encoding="utf-8")
    return code, text


def _mock_env(force: str, **extra: str) -> dict:
    base = {**os.environ, **extra}
    env = mock_env.apply(base, mock_env.enable_changes(base, force))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def check_pretrain(tree: Path, nproc: int, iters: int, force: str, timeout: int) -> Outcome:
    env = _mock_env(force)
    port = str(free_port())
    flags = [*PRETRAIN_FLAGS, "--train-iters", str(iters)]
    if nproc == 1:
        env.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        cmd = [sys.executable, "pretrain_glm.py", *flags]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
               "--master_addr", "127.0.0.1", "--master_port", port, "pretrain_glm.py", *flags]  # fmt: skip
    name = f"pretrain_glm.py, {nproc} process{'es' if nproc > 1 else ''}"
    log = tree.parent / f"pretrain_nproc{nproc}.log"
    code, text = _run(cmd, tree, env, log, timeout)
    losses = [float(x) for x in LOSS.findall(text)]
    if code != 0:
        return Outcome(name, "FAIL", f"exit code {code}", log)
    if len(losses) != iters:
        return Outcome(name, "FAIL", f"{len(losses)} loss lines for {iters} iterations", log)
    k = max(1, iters // 4)
    head, tail = sum(losses[:k]) / k, sum(losses[-k:]) / k
    ok = all(math.isfinite(x) for x in losses) and tail < head
    detail = f"lm loss {losses[0]:.4f} -> {losses[-1]:.4f} (mean of first {k} {head:.4f}, last {k} {tail:.4f})"
    return Outcome(name, "PASS" if ok else "FAIL", detail, log)


def check_mpu_test(tree: Path, script: str, force: str, timeout: int) -> Outcome:
    # From the repository root; the scripts find `commons` beside them, and `mpu` through the
    # user's PYTHONPATH, which the mock keeps behind its own entry.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), f"mpu/tests/{script}"]  # fmt: skip
    log = tree.parent / f"mpu_{Path(script).stem}.log"
    code, text = _run(cmd, tree, _mock_env(force, PYTHONPATH=str(tree)), log, timeout)
    name = f"mpu/tests/{script}"
    if code == 0:
        return Outcome(name, "PASS", "passed", log)
    defect = UPSTREAM_DEFECTS.get(script)
    if defect and defect in text:
        passed = text.count(">> passed the test")
        return Outcome(name, "UPSTREAM", f"upstream's own defect, not the mock: {defect} "
                       f"(after {passed} '>> passed the test' lines)", log)  # fmt: skip
    errors = [line for line in text.splitlines() if "Error" in line]
    return Outcome(name, "FAIL", f"exit code {code}: {errors[-1] if errors else 'see log'}", log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m migrate.mock.selfcheck",
        description="Run an unmodified THUDM/GLM checkout under glm-mock on CPU: pretrain_glm.py "
        "(2 layers, hidden 64, fp32, --train-data test) and the mpu/tests scripts.",
    )
    parser.add_argument("upstream", type=Path, help="THUDM/GLM checkout (left untouched; a copy is run)")
    parser.add_argument("--nproc", type=int, nargs="*", default=[1, 2], help="process counts to pretrain with (none: skip)")
    parser.add_argument("--iters", type=int, default=20, help="training iterations per run")
    parser.add_argument("--no-mpu-tests", action="store_true", help="skip upstream's mpu/tests scripts")
    parser.add_argument("--force", default="", help="passed to glm-mock: stand-ins win over installed packages")
    parser.add_argument("--vocab", type=Path, default=DEFAULT_VOCAB, help=f"the {VOCAB_NAME} to use if the checkout lacks one")
    parser.add_argument("--workdir", type=Path, help="scratch directory (default: a new temporary one)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per run")
    args = parser.parse_args(argv)
    if not (args.upstream / "pretrain_glm.py").is_file():
        parser.error(f"{args.upstream} is not a THUDM/GLM checkout (no pretrain_glm.py)")

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="glm-mock-selfcheck-"))
    tree = prepare_tree(args.upstream.resolve(), workdir.resolve(), args.vocab)
    ensure_corpus(tree / ".pytorch_pretrained_bert" / VOCAB_NAME)
    checks = [lambda n=n: check_pretrain(tree, n, args.iters, args.force, args.timeout) for n in args.nproc]
    if not args.no_mpu_tests:
        checks += [lambda s=s: check_mpu_test(tree, s, args.force, args.timeout) for s in MPU_TESTS]
    outcomes = []
    for check in tqdm(checks, desc="glm-mock selfcheck", unit="run", disable=None):  # None: no bar unless a terminal
        outcome = check()
        outcomes.append(outcome)
        tqdm.write(f"{outcome.status:<8}  {outcome.name}: {outcome.detail}  (log: {outcome.log})")
    counts = {status: sum(o.status == status for o in outcomes) for status in ("PASS", "UPSTREAM", "FAIL")}
    print(f"{counts['PASS']} passed, {counts['UPSTREAM']} failed for upstream's own reason, "
          f"{counts['FAIL']} failed; logs in {workdir}")  # fmt: skip
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
