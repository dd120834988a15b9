"""Running an unmodified THUDM/GLM checkout: its flags, its data, its environments, its logs.

What ``harness.selfcheck`` (the checkout under glm-mock), ``harness.verify`` (the checkout
against its migration) and the benches share. Nothing here knows a path outside the
repository: the checkout says where it reads its corpus (:func:`corpus_path`), the
vocabulary comes from the checkout, ``--vocab`` or ``$GLM_VOCAB`` (:func:`find_vocab`).
"""

from __future__ import annotations

import ast
import json
import os
import random
import re
import shutil
import socket
import subprocess
from pathlib import Path

from migrate.mock import environ as _mock_environ

PROJECT_ROOT = Path(__file__).resolve().parents[1]
VOCAB_NAME = "bert-base-uncased-vocab.txt"
VOCAB_ENV = "GLM_VOCAB"  # a BERT vocabulary file, or a directory holding VOCAB_NAME
VOCAB_CACHE = Path(".pytorch_pretrained_bert") / VOCAB_NAME  # where upstream reads it, inside the checkout

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
ELAPSED = re.compile(r"elapsed time per iteration \(ms\): ([0-9.]+)")
# `--train-data test` is upstream's TestDataset, which reads the file its PATH names.
CORPORA = Path("data_utils") / "corpora.py"
TEST_CORPUS_CLASS = "TestDataset"


class HarnessError(ValueError):
    """Bad input to the harness (not a checkout, no vocabulary...); the commands print it on one
    line and exit with status 2."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 nobody listens on now (for MASTER_PORT / torchrun --master_port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_checkout(path: Path) -> Path:
    """``path`` resolved, if it is a THUDM/GLM checkout (has ``pretrain_glm.py``); else HarnessError."""
    if not (Path(path) / "pretrain_glm.py").is_file():
        raise HarnessError(f"{path} is not a THUDM/GLM checkout (no pretrain_glm.py)")
    return Path(path).resolve()


def find_vocab(given: Path | str | None = None, checkout: Path | None = None) -> Path:
    """BERT's ``bert-base-uncased-vocab.txt``: ``given`` (a file, or a directory holding it), else
    ``$GLM_VOCAB`` (the same), else the one the checkout ships in ``.pytorch_pretrained_bert/``."""
    for value, origin in ((given, "--vocab"), (os.environ.get(VOCAB_ENV) or None, f"${VOCAB_ENV}")):
        if value is None:
            continue
        path = Path(value)
        if path.is_dir():
            path = path / VOCAB_NAME
        if not path.is_file():
            raise HarnessError(f"{origin} {value}: no such file (BERT's {VOCAB_NAME}, or a directory holding it)")
        return path.resolve()
    if checkout is not None and (Path(checkout) / VOCAB_CACHE).is_file():
        return (Path(checkout) / VOCAB_CACHE).resolve()
    where = f"{checkout} has no {VOCAB_CACHE}; " if checkout is not None else ""
    raise HarnessError(f"{where}no BERT vocabulary: give --vocab PATH or set {VOCAB_ENV}=PATH ({VOCAB_NAME} "
                       f"or a directory holding it)")  # fmt: skip


def prepare_tree(upstream: Path, workdir: Path, vocab: Path | None = None) -> Path:
    """A writable copy of the checkout (upstream writes logs beside itself) with the vocabulary
    where upstream reads it: ``vocab`` (see :func:`find_vocab`) linked in if the checkout lacks one."""
    source = None if (Path(upstream) / VOCAB_CACHE).exists() else find_vocab(vocab)  # upstream ships it;
    tree = Path(workdir) / "GLM"  # some copies leave it out
    if tree.exists():
        shutil.rmtree(tree)
    shutil.copytree(upstream, tree, ignore=shutil.ignore_patterns(".git", "__pycache__"))
    if source is not None:
        (tree / VOCAB_CACHE).parent.mkdir(exist_ok=True)
        (tree / VOCAB_CACHE).symlink_to(source)
    return tree


def corpus_path(checkout: Path) -> Path:
    """Where the checkout's ``--train-data test`` reads its corpus: ``TestDataset.PATH`` in
    ``data_utils/corpora.py`` (a fixed absolute path in THUDM/GLM), read from the source."""
    source = Path(checkout) / CORPORA
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"), str(source))
    except (OSError, SyntaxError) as exc:
        raise HarnessError(f"cannot read {source}: {exc}") from None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == TEST_CORPUS_CLASS:
            for stmt in node.body:
                if (isinstance(stmt, ast.Assign) and [getattr(t, "id", None) for t in stmt.targets] == ["PATH"]
                        and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)):  # fmt: skip
                    path = Path(stmt.value.value)
                    return path if path.is_absolute() else Path(checkout) / path
    raise HarnessError(f"{source}: no class {TEST_CORPUS_CLASS} with a string PATH (where --train-data test reads)")


def ensure_corpus(vocab: Path, path: Path, documents: int = 400) -> Path:
    """Write ``path`` unless it exists: JSON lines ``{"prompt": "", "text": ...}`` of sentences drawn
    from the vocabulary, seeded (the same bytes every time). Returns ``path``."""
    path = Path(path)
    if path.exists():
        return path
    words = [w for w in Path(vocab).read_text(encoding="utf-8").split() if w.isalpha() and len(w) > 2][:3000]
    rng = random.Random(0)
    common = words[:200]  # a skewed distribution the model can learn within 20 steps
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HarnessError(f"cannot create {path.parent} for the corpus: {exc}") from None
    lines = []
    for _ in range(documents):
        sentences = []
        for _ in range(rng.randint(6, 12)):
            n = rng.randint(8, 20)
            sentence = [rng.choice(common) if rng.random() < 0.8 else rng.choice(words) for _ in range(n)]
            sentences.append(" ".join(sentence).capitalize() + ".")
        lines.append(json.dumps({"prompt": "", "text": " ".join(sentences)}) + "\n")
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text("".join(lines), encoding="utf-8")
    os.replace(partial, path)  # never half-written
    return path


def checkout_corpus(tree: Path) -> Path:
    """The checkout's ``--train-data test`` corpus (:func:`corpus_path`), written from its vocabulary if absent."""
    return ensure_corpus(Path(tree) / VOCAB_CACHE, corpus_path(tree))


def run_upstream(cmd: list[str], cwd: Path, env: dict, log: Path, timeout: int, stdin: str | None = None) -> tuple[int, str]:
    """Run one command of the harness in ``cwd`` (``stdin``: text to feed it); (exit code, stdout and
    stderr), also kept in ``log``. A run past ``timeout`` seconds gets exit code -1."""
    try:
        proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout, input=stdin)  # fmt: skip
        code, text = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as exc:
        code, text = -1, (exc.stdout or b"").decode(errors="replace") + f"\n[timed out after {timeout} s]"
    log.write_text(f"$ {' '.join(cmd)}\n{text}", encoding="utf-8")
    return code, text


def mock_env(force: str = "", **extra: str) -> dict:
    """This process's environment plus ``extra``, with glm-mock on (``force``: as ``glm-mock --force``)."""
    base = {**os.environ, **extra}
    env = _mock_environ.apply(base, _mock_environ.enable_changes(base, force))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def ported_env() -> dict:
    """The environment with glm-mock off (if the caller had it on) and shim importable."""
    env = _mock_environ.apply(dict(os.environ), _mock_environ.disable_changes(os.environ))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PROJECT_ROOT), env.get("PYTHONPATH")) if p)
    env["GLM_MOCK_DISABLE"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    return env
