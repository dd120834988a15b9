"""Parallelism is invisible in the math: glm-pretrain on several ranks logs what one process logs.

fp32, no dropout. Data parallel 2 at --batch-size b == one process at 2b (same samples, same order);
tensor parallel 2 == one process; both together on 4 ranks == one process at 2b, with ZeRO stage 2 or 3
too (FSDP2 over the dp dimension of the (dp, tp) mesh). The runs of one world size share ONE torchrun
launch of gloo ranks (tests/conftest.py's ``torchrun_mains``), each rank calling glm-pretrain's ``main``.
"""

import contextlib
import io
import re
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed.tensor  # noqa: F401  (tensor-parallel optimizer state holds DTensors)

from glm_port.pretrain_glm import main

from ..conftest import torchrun_mains

COMMON = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "32",
          "--train-iters", "4", "--log-interval", "1", "--hidden-dropout", "0", "--attention-dropout", "0",
          "--lr", "3e-3", "--eval-iters", "2", "--eval-interval", "2"]
RUNS = {  # name: (world size, argv of each rank, argv of the one-process run)
    "data_parallel": (2, ["--batch-size", "2"], ["--batch-size", "4"]),
    "tensor_parallel": (2, ["--batch-size", "4", "--model-parallel-size", "2"], ["--batch-size", "4"]),
    "tensor_and_data_parallel": (4, ["--batch-size", "2", "--model-parallel-size", "2"], ["--batch-size", "4"]),
    # Selective checkpointing keeps the all-reduces' outputs; recomputing must still give the same grads.
    "tensor_parallel_selective_checkpointing": (
        2, ["--batch-size", "4", "--model-parallel-size", "2", "--checkpoint-policy", "selective"],
        ["--batch-size", "4"]),
    # ZeRO stage 3 from a DeepSpeed config: FSDP2 over the 2 data-parallel ranks (glm_port.sharding)
    "zero3_data_parallel": (2, ["--batch-size", "2", "--deepspeed_config", "{out_dir}/zero3.json"],
                            ["--batch-size", "4"]),
    # ... resuming an unsharded checkpoint (iteration 2 of one process): its weights and iteration, a fresh
    # optimizer, as one process with --no-load-optim
    "zero3_from_an_unsharded_checkpoint": (
        2, ["--batch-size", "2", "--deepspeed_config", "{out_dir}/zero3.json", "--load", "{out_dir}/unsharded"],
        ["--batch-size", "4", "--load", "{out_dir}/unsharded", "--no-load-optim"]),
    # ZeRO with tensor parallel: FSDP2 over the dp dimension of the (dp, tp) mesh, 2 x 2 on 4 ranks
    **{f"tensor_parallel_zero{stage}": (
        4, ["--batch-size", "2", "--model-parallel-size", "2", "--deepspeed_config", f"{{out_dir}}/zero{stage}.json"],
        ["--batch-size", "4"]) for stage in (2, 3)},
    # ... resuming its own DCP checkpoint (2 iterations at TP 2 x ZeRO 3, saved by the launch before), as one
    # process resumes its checkpoint of the same 2 iterations
    "tensor_parallel_zero3_resumed": (
        4, ["--batch-size", "2", "--model-parallel-size", "2", "--deepspeed_config", "{out_dir}/zero3.json",
            "--load", "{out_dir}/tp_zero3"], ["--batch-size", "4", "--load", "{out_dir}/unsharded"]),
}
# Runs before a world size's RUNS whose output no test reads but their checkpoints.
SAVES = {
    2: ["--batch-size", "4", "--model-parallel-size", "2", "--train-iters", "2", "--save", "{out_dir}/tp_checkpoint"],
    4: ["--batch-size", "2", "--model-parallel-size", "2", "--deepspeed_config", "{out_dir}/zero3.json",
        "--train-iters", "2", "--eval-iters", "0", "--save", "{out_dir}/tp_zero3"],
}
TIMEOUT_S = 240
LOSS = re.compile(r"^ iteration +(\d+)/ +\d+ \| .* \| lm loss (\S+) \|$", re.MULTILINE)
VALIDATION = re.compile(r"^ validation loss at (.+) \| LM loss: (\S+) \| LM PPL: (\S+)$", re.MULTILINE)


def logged_losses(text: str) -> dict[int, float]:
    return {int(m[1]): float(m[2]) for m in LOSS.finditer(text)}


def validation_losses(text: str) -> dict[str, float]:
    return {m[1]: float(m[2]) for m in VALIDATION.finditer(text)}


def _launch(world_size: int, out_dir: str) -> dict:
    """The runs of ``world_size`` ranks in ONE torchrun launch: ``{name.rank.txt: log}``."""
    names = [None, *(name for name, (world, _, _) in RUNS.items() if world == world_size)]
    runs = [[*COMMON, *(a.format(out_dir=out_dir) for a in (SAVES[world_size] if name is None else RUNS[name][1]))]
            for name in names]
    launch_dir = Path(out_dir, f"world{world_size}")
    launch_dir.mkdir()
    per_run = torchrun_mains("glm_port.pretrain_glm:main", runs, world_size, launch_dir, TIMEOUT_S, check=False)
    return {f"{name}.{rank}.txt": log for name, logs in zip(names, per_run) if name for rank, log in enumerate(logs)}


@pytest.fixture(scope="module")
def rank_logs():
    """Logs of every run, by ``name.rank.txt``, and the two shards the 2-rank tensor-parallel run saved."""
    with tempfile.TemporaryDirectory() as out_dir:
        Path(out_dir, "zero3.json").write_text('{"zero_optimization": {"stage": 3}}')
        with contextlib.redirect_stdout(io.StringIO()):
            main([*COMMON, "--batch-size", "4", "--train-iters", "2", "--eval-iters", "0", "--save",
                  str(Path(out_dir, "unsharded"))])
        Path(out_dir, "zero2.json").write_text('{"zero_optimization": {"stage": 2}}')
        logs = {}
        for world_size in sorted({world for world, _, _ in RUNS.values()}):
            logs.update(_launch(world_size, out_dir))
        checkpoint = Path(out_dir, "tp_checkpoint", "2")
        shards = [torch.load(checkpoint / f"mp_rank_{r:02d}_model_states.pt", weights_only=True)["module"]
                  for r in (0, 1)]
        yield logs, shards, out_dir


@pytest.mark.parametrize("name", list(RUNS))
def test_ranks_log_the_losses_of_one_process(name, rank_logs, capsys):
    logs, _, out_dir = rank_logs
    world_size, _, single_argv = RUNS[name]
    for rank in range(world_size):
        assert "FAILED" not in logs[f"{name}.{rank}.txt"], logs[f"{name}.{rank}.txt"]
        if rank:
            assert logged_losses(logs[f"{name}.{rank}.txt"]) == {}  # only rank 0 logs
    parallel = logged_losses(logs[f"{name}.0.txt"])
    if "zero" in name:
        stage = name[-1] if name[-1].isdigit() else "3"
        assert (f"ZeRO stage {stage}: parameters, gradients and optimizer state sharded over the 2"
                in logs[f"{name}.0.txt"])
    if name.startswith("tensor_parallel_zero"):
        assert "(FSDP2 on the (dp, tp) mesh, tensor parallel 2;" in logs[f"{name}.0.txt"]
        # the count upstream prints: what one tensor-parallel rank holds (as tensor parallel alone prints it)
        count = re.compile(r"number of parameters on model parallel rank 0: (\d+)")
        assert count.findall(logs[f"{name}.0.txt"]) == count.findall(logs["tensor_and_data_parallel.0.txt"]) != []
    if name == "zero3_from_an_unsharded_checkpoint":
        assert "is unsharded: its weights and iteration are loaded, its optimizer state is not" in logs[f"{name}.0.txt"]

    main([*COMMON, *(a.format(out_dir=out_dir) for a in single_argv)])
    out = capsys.readouterr().out
    single = logged_losses(out)
    assert sorted(parallel) == sorted(single) == ([3, 4] if "--load" in single_argv else [1, 2, 3, 4])
    for iteration, loss in single.items():
        assert parallel[iteration] == pytest.approx(loss, rel=1e-4), iteration
    assert single[4] != single[min(single)]  # it trained
    # Validation (every 2 iterations, at the end) and test: the same numbers as one process.
    parallel_eval, single_eval = validation_losses(logs[f"{name}.0.txt"]), validation_losses(out)
    assert list(single_eval) == ["iteration 2"] * ("--load" not in single_argv) + [
        "iteration 4", "the end of training for val data", "the end of training for test data"]
    assert parallel_eval == pytest.approx(single_eval, rel=1e-4)
    for rank in range(1, world_size):
        assert validation_losses(logs[f"{name}.{rank}.txt"]) == {}


def test_tensor_parallel_checkpoint_is_upstreams_per_rank_layout(rank_logs, tmp_path, capsys):
    """mp_rank_00/01 hold Megatron's shards: QKV per third, h->4h and embeddings by rows, dense and
    4h->h by columns; they reassemble into the one-process weights after the same two steps."""
    _, shards, _ = rank_logs
    main([*COMMON, "--batch-size", "4", "--train-iters", "2", "--save", str(tmp_path)])
    capsys.readouterr()
    single = torch.load(tmp_path / "2" / "mp_rank_00_model_states.pt", weights_only=True)["module"]
    assert set(shards[0]) == set(shards[1]) == set(single)
    h = 32
    for name, whole in single.items():
        parts = [shard[name] for shard in shards]
        if "query_key_value" in name:
            assert parts[0].shape[0] == 3 * h // 2
            merged = torch.cat([torch.cat([p.chunk(3)[i] for p in parts]) for i in range(3)])
        elif name == "word_embeddings.weight" or "dense_h_to_4h" in name:
            merged = torch.cat(parts)
        elif name.endswith("dense.weight") or "dense_4h_to_h.weight" in name:
            merged = torch.cat(parts, dim=1)
        else:  # replicated: LayerNorms, position embeddings, row-parallel biases
            torch.testing.assert_close(parts[0], parts[1])
            merged = parts[0]
        torch.testing.assert_close(merged, whole, rtol=1e-4, atol=1e-5, msg=name)


def test_tensor_parallel_zero_loads_a_plain_tensor_parallel_checkpoint_as_tensor_parallel_resumes_it(tmp_path):
    """A plain (per-rank ``mp_rank_XX`` files, not DCP) checkpoint of a TP 2 run without ZeRO, loaded by TP 2
    with ZeRO stage 2 or 3 (FSDP2 on the (dp, tp) mesh, 4 ranks): each tensor-parallel rank's weights and the
    iteration, a fresh optimizer; iterations 3-4 log what TP 2 without ZeRO logs resumed from it with
    --no-load-optim (1e-4)."""
    for stage in (2, 3):
        (tmp_path / f"zero{stage}.json").write_text(f'{{"zero_optimization": {{"stage": {stage}}}}}')
    tp = [*COMMON, "--batch-size", "2", "--model-parallel-size", "2", "--eval-iters", "0"]
    plain = str(tmp_path / "plain")
    runs = [[*tp, "--train-iters", "2", "--save", plain],
            *([*tp, "--deepspeed_config", str(tmp_path / f"zero{stage}.json"), "--load", plain] for stage in (2, 3)),
            [*tp, "--load", plain, "--no-load-optim"]]
    per_run = torchrun_mains("glm_port.pretrain_glm:main", runs, 4, tmp_path, TIMEOUT_S)
    assert sorted(Path(plain, "2").glob("mp_rank_*")) == [Path(plain, "2", f"mp_rank_0{r}_model_states.pt")
                                                           for r in (0, 1)]
    reference = logged_losses(per_run[3][0])
    assert sorted(reference) == [3, 4]
    for stage, logs in zip((2, 3), per_run[1:3]):
        assert f"ZeRO stage {stage}: parameters, gradients and optimizer state sharded over the 2" in logs[0]
        assert "is unsharded: its weights and iteration are loaded, its optimizer state is not" in logs[0]
        losses = logged_losses(logs[0])
        assert sorted(losses) == [3, 4], logs[0]
        for iteration, loss in reference.items():
            assert losses[iteration] == pytest.approx(loss, rel=1e-4), (stage, iteration)
