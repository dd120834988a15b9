"""Against a real NVIDIA/Megatron-LM v2.6 tree (MEGATRON_UPSTREAM=/path; skipped without one, as in CI).

    git -C MEGATRON_GIT archive v2.6 | tar -x -C /tmp/megatron-v2.6
    MEGATRON_UPSTREAM=/tmp/megatron-v2.6 python -m pytest -q tests/e2e/test_megatron_e2e.py

glm-migrate converts the tree (no apex / amp_C / fused-kernel site left, no file error); the migrated
``tools/preprocess_data.py`` builds GPT-2 and BERT datasets from a corpus written here; the migrated
``pretrain_gpt.py`` and ``pretrain_bert.py`` (2 layers, hidden 64, seq 128) train 20 iterations on the
CPU in one process and under torchrun with tensor parallel 2, and log the losses the unmodified tree
logs under glm-mock (fp32, dropout 0, 1e-5 relative). Slow: about 15 minutes on two cores.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from harness import mock_env, ported_env


REPO = Path(__file__).resolve().parents[2]
VOCAB = Path(os.environ.get("GLM_VOCAB") or next(
    (p / "shared" / "vocab" for p in (REPO.parent, REPO.parent.parent) if (p / "shared" / "vocab").is_dir()),
    REPO.parent / "shared" / "vocab"))  # ../shared/vocab beside the checkout (or beside a worktree's parent)
REFERENCE = Path(__file__).with_name("megatron_reference.py")
ITERS = 20
LOSS = re.compile(r"(lm loss|sop loss): ([0-9.]+E[+-][0-9]+)")

COMMON = [
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "128",
    "--max-position-embeddings", "128", "--micro-batch-size", "4", "--global-batch-size", "4",
    "--train-iters", str(ITERS), "--lr", "0.0001", "--lr-decay-style", "constant", "--min-lr", "0.0",
    "--weight-decay", "0.01", "--clip-grad", "1.0", "--data-impl", "mmap", "--log-interval", "1",
    "--eval-interval", "1000", "--eval-iters", "0", "--hidden-dropout", "0", "--attention-dropout", "0",
    "--distributed-backend", "gloo", "--seed", "1234", "--no-masked-softmax-fusion",
    "--no-bias-gelu-fusion", "--no-bias-dropout-fusion",
]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def megatron_upstream() -> Path:
    value = os.environ.get("MEGATRON_UPSTREAM")
    if not value:
        pytest.skip("needs a Megatron-LM v2.6 tree: set MEGATRON_UPSTREAM=/path (git archive v2.6 of NVIDIA/Megatron-LM)")
    path = Path(value)
    if not (path / "pretrain_gpt.py").is_file() or not (path / "megatron" / "fused_kernels").is_dir():
        pytest.fail(f"MEGATRON_UPSTREAM={value} is not a Megatron-LM v2.x tree (no pretrain_gpt.py / fused_kernels)")
    if not (VOCAB / "gpt2-vocab.json").is_file() or not (VOCAB / "bert-base-uncased-vocab.txt").is_file():
        pytest.skip(f"needs the GPT-2 and BERT vocabularies in {VOCAB} (set GLM_VOCAB)")
    try:
        import pybind11  # noqa: F401  (Megatron compiles its dataset helpers with it)
    except ImportError:
        pytest.skip("Megatron builds megatron/data/helpers.cpp with pybind11: pip install pybind11")
    return path.resolve()


def _corpus(path: Path) -> None:
    """300 documents of 3-8 sentences of words from the BERT vocabulary (written here, seeded)."""
    words = [w for w in (VOCAB / "bert-base-uncased-vocab.txt").read_text(encoding="utf-8").split()
             if w.isalpha() and w.islower() and len(w) > 2][:3000]
    rng = random.Random(0)
    with path.open("w", encoding="utf-8") as f:
        for _ in range(300):
            sentences = [" ".join(rng.choice(words) for _ in range(rng.randint(5, 20))).capitalize() + "."
                         for _ in range(rng.randint(3, 8))]
            f.write(json.dumps({"text": " ".join(sentences)}) + "\n")


def _punkt(root: Path) -> Path:
    """NLTK data whose English punkt model has no learned parameters: nltk then splits on '.', '?', '!'
    (nltk >= 3.9 reads punkt_tab; the hub download is not reachable here)."""
    english = root / "tokenizers" / "punkt_tab" / "english"
    english.mkdir(parents=True, exist_ok=True)
    for name in ("abbrev_types.txt", "collocations.tab", "sent_starters.txt", "ortho_context.tab"):
        (english / name).touch()
    return root


def _run(cmd: list[str], cwd: Path, env: dict, log: Path, timeout: int = 900) -> str:
    with log.open("w") as out:
        code = subprocess.run(cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
    text = log.read_text(errors="replace")
    assert code == 0, f"{' '.join(cmd[:6])}... exited {code}; end of {log}:\n{text[-3000:]}"
    return text


@pytest.fixture(scope="session")
def megatron_trees(megatron_upstream, tmp_path_factory):
    """(original copy, migrated tree, data dir) with the GPT and BERT datasets built by the migrated tree."""
    work = tmp_path_factory.mktemp("megatron")
    original, migrated, data = work / "original", work / "migrated", work / "data"
    shutil.copytree(megatron_upstream, original)
    data.mkdir()
    env = ported_env()
    _run([sys.executable, "-m", "migrate.cli", str(original), "-o", str(migrated), "--quiet"], REPO, env,
         work / "migrate.log")
    _corpus(data / "corpus.json")
    env["NLTK_DATA"] = str(_punkt(work / "nltk_data"))
    preprocess = [sys.executable, "tools/preprocess_data.py", "--input", str(data / "corpus.json"),
                  "--dataset-impl", "mmap", "--workers", "1"]
    _run([*preprocess, "--output-prefix", str(data / "gpt"), "--vocab", str(VOCAB / "gpt2-vocab.json"),
          "--merge-file", str(VOCAB / "gpt2-merges.txt"), "--tokenizer-type", "GPT2BPETokenizer", "--append-eod"],
         migrated, env, work / "preprocess_gpt.log")
    _run([*preprocess, "--output-prefix", str(data / "bert"), "--vocab", str(VOCAB / "bert-base-uncased-vocab.txt"),
          "--tokenizer-type", "BertWordPieceLowerCase", "--split-sentences"], migrated, env, work / "preprocess_bert.log")
    return original, migrated, data


def test_migration_leaves_no_apex_amp_c_or_kernel_site(megatron_trees):
    _, migrated, _ = megatron_trees
    report = json.loads((migrated / "migration_report.json").read_text())
    summary = report["summary"]
    assert summary["errors"] == 0
    for package in ("apex", "amp_C", "megatron fused kernels"):
        row = summary["coverage"][package]
        assert row["found"] > 0 and row["unconverted"] == 0, (package, row)


def test_preprocess_data_builds_both_datasets(megatron_trees):
    _, _, data = megatron_trees
    for prefix in ("gpt_text_document", "bert_text_sentence"):
        assert (data / f"{prefix}.bin").stat().st_size > 0 and (data / f"{prefix}.idx").is_file()


def _train(tree: Path, script: str, data: Path, nproc: int, env: dict, launcher: list[str], log: Path):
    if script == "pretrain_gpt.py":
        flags = ["--data-path", str(data / "gpt_text_document"), "--vocab-file", str(VOCAB / "gpt2-vocab.json"),
                 "--merge-file", str(VOCAB / "gpt2-merges.txt"), "--split", "949,50,1"]
    else:
        flags = ["--data-path", str(data / "bert_text_sentence"), "--split", "1000,0,0",
                 "--vocab-file", str(VOCAB / "bert-base-uncased-vocab.txt")]
    flags = [*COMMON, *flags, "--tensor-model-parallel-size", str(nproc)]
    port = str(_free_port())
    env = {**env, "OMP_NUM_THREADS": "1"}
    if nproc == 1:
        env.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        cmd = [sys.executable, *launcher, script, *flags]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_addr",
               "127.0.0.1", "--master_port", port, *(launcher or []), script, *flags]
    text = _run(cmd, tree, env, log)
    return [(name, float(value)) for name, value in LOSS.findall(text)]


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("nproc", [1, 2], ids=["one-process", "torchrun-tp2"])
@pytest.mark.parametrize("script", ["pretrain_gpt.py", "pretrain_bert.py"])
def test_migrated_tree_trains_with_the_unmodified_trees_losses(megatron_trees, script, nproc, tmp_path):
    original, migrated, data = megatron_trees
    ours = _train(migrated, script, data, nproc, ported_env(), [], tmp_path / "migrated.log")
    theirs = _train(original, script, data, nproc, mock_env(""), [str(REFERENCE)], tmp_path / "original.log")
    per_iteration = 1 if script == "pretrain_gpt.py" else 2  # BERT logs lm and sop loss
    assert len(ours) == ITERS * per_iteration, ours
    assert [name for name, _ in ours] == [name for name, _ in theirs]
    for (name, a), (_, b) in zip(ours, theirs):
        assert a == pytest.approx(b, rel=1e-5), (name, ours, theirs)
    worst = max(abs(a - b) / abs(b) for (_, a), (_, b) in zip(ours, theirs))
    print(f"\n{script} nproc={nproc}: lm loss {ours[0][1]:.6E} -> {ours[-per_iteration][1]:.6E}, "
          f"largest relative difference {worst:.1e}")


FUSED_PATHS = """
import torch
from megatron.model.enums import AttnMaskType
from megatron.model.fused_layer_norm import MixedFusedLayerNorm
from megatron.model.fused_softmax import FusedScaleMaskSoftmax
from megatron.model.fused_bias_gelu import bias_gelu_impl
from megatron.model.transformer import bias_dropout_add_fused_train
from megatron.model.utils import attention_mask_func

x = torch.randn(4, 2, 32, 32).half()
masks = {AttnMaskType.padding: torch.rand(4, 1, 32, 32) > 0.8,
         AttnMaskType.causal: torch.ones(32, 32, dtype=torch.bool).triu(1)[None, None].expand(4, 1, 32, 32)}
for kind, mask in masks.items():
    fused = FusedScaleMaskSoftmax(True, False, kind, True, attention_mask_func, True, 0.125)
    plain = FusedScaleMaskSoftmax(True, False, kind, False, attention_mask_func, True, 0.125)
    assert fused.is_kernel_available(mask, 4, 2, 32, 32)
    assert (fused(x, mask).float() - plain(x, mask).float()).abs().max() < 1e-3
y, b = torch.randn(3, 8, requires_grad=True), torch.randn(8, requires_grad=True)
bias_gelu_impl(y, b).sum().backward()
bias_dropout_add_fused_train(torch.randn(3, 8), torch.randn(8), torch.randn(3, 8), 0.1)
z = torch.randn(3, 8, requires_grad=True)
out = MixedFusedLayerNorm(8)(z)
out.sum().backward()
assert (out - torch.nn.functional.layer_norm(z, (8,))).abs().max() < 1e-6
print("FUSED PATHS OK")
"""


def test_fused_kernel_paths_run_on_cpu(megatron_trees, tmp_path):
    """The paths Megatron takes with fusion on (fp16 scores: its CUDA softmax kernels; MixedFusedLayerNorm;
    the torch.jit.script bias-GeLU / bias-dropout-add fusions) run in the migrated tree on the CPU, and
    the fused softmax equals the tree's own unfused path."""
    _, migrated, _ = megatron_trees
    env = {**ported_env(), "PYTHONPATH": os.pathsep.join([str(migrated), ported_env()["PYTHONPATH"]])}
    text = _run([sys.executable, "-c", FUSED_PATHS], migrated, env, tmp_path / "fused.log", timeout=300)
    assert "FUSED PATHS OK" in text
