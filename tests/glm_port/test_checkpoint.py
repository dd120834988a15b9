"""Checkpoints: upstream's layout, atomic saves, exact resume, upstream/HF weights, clear errors."""

import os
from pathlib import Path

import pytest
import torch

from glm_port import GLMConfig, GLMModel
from glm_port.checkpoint_io import TRACKER, CheckpointError, load_checkpoint, save_checkpoint
from glm_port.training import OptimizerSettings, Precision, build_optimizer, train_step

TINY = GLMConfig(vocab_size=64, num_layers=2, hidden_size=32, num_attention_heads=4, max_sequence_length=16)


def batches(seed=0, batch=2, seq=12):
    g = torch.Generator().manual_seed(seed)
    while True:
        sep = torch.randint(3, seq - 2, (batch,), generator=g)
        columns = torch.arange(seq).expand(batch, seq)
        yield {
            "text": torch.randint(0, 64, (batch, seq), generator=g),
            "target": torch.randint(0, 64, (batch, seq), generator=g),
            "loss_mask": (columns >= sep[:, None]).float(),
            "attention_mask": sep,
            "position_id": torch.stack([columns, (columns - sep[:, None] + 1).clamp(min=0)], dim=1),
        }


def fresh(seed=0):
    torch.manual_seed(seed)
    model = GLMModel(TINY)  # dropout on: resume must replay the RNG too
    optimizer, scheduler = build_optimizer(model, OptimizerSettings(lr=5e-3, warmup=0.2, decay_iters=8,
                                                                    decay_style="cosine"))
    return model, optimizer, scheduler, Precision(torch.device("cpu"))


def run(model, optimizer, scheduler, precision, data, steps):
    return [train_step(model, [next(data)], optimizer, scheduler, precision) for _ in range(steps)]


def test_layout_is_upstreams(tmp_path):
    model, optimizer, scheduler, _ = fresh()
    save_checkpoint(tmp_path, 7, model.state_dict(), config=TINY, optimizer=optimizer, scheduler=scheduler)
    assert (tmp_path / TRACKER).read_text() == "7"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["7", TRACKER]
    sd = torch.load(tmp_path / "7" / "mp_rank_00_model_states.pt", weights_only=True)
    assert sd["iteration"] == 7
    assert set(sd["module"]) == set(model.state_dict())
    assert {"optimizer", "lr_scheduler", "random_rng_state", "np_rng_state", "torch_rng_state"} <= set(sd)


def test_resume_continues_exactly(tmp_path):
    """Train 4 + save + resume 4 in a new model == train 8 straight, loss for loss."""
    model, optimizer, scheduler, precision = fresh()
    data = batches()
    straight = run(model, optimizer, scheduler, precision, data, 8)

    model, optimizer, scheduler, precision = fresh()
    data = batches()
    first = run(model, optimizer, scheduler, precision, data, 4)
    save_checkpoint(tmp_path, 4, model.state_dict(), config=TINY, optimizer=optimizer, scheduler=scheduler)
    torch.manual_seed(999)  # whatever happens in between must not matter

    model, optimizer, scheduler, precision = fresh(seed=5)
    iteration = load_checkpoint(tmp_path, model, optimizer=optimizer, scheduler=scheduler)
    assert iteration == 4
    data = batches()
    for _ in range(4):  # the data stream resumes where it stopped
        next(data)
    second = run(model, optimizer, scheduler, precision, data, 4)
    assert first + second == straight


def test_interrupted_save_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    model, *_ = fresh()
    save_checkpoint(tmp_path, 1, model.state_dict(), config=TINY)
    good = (tmp_path / "1" / "mp_rank_00_model_states.pt").read_bytes()

    def crash(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, model.state_dict(), config=TINY)
    monkeypatch.undo()
    assert (tmp_path / TRACKER).read_text() == "1"
    assert not (tmp_path / "2").exists()
    assert (tmp_path / "1" / "mp_rank_00_model_states.pt").read_bytes() == good
    # The next save clears the debris and succeeds.
    save_checkpoint(tmp_path, 2, model.state_dict(), config=TINY)
    assert (tmp_path / TRACKER).read_text() == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2", TRACKER]


def test_saving_an_iteration_again_replaces_it(tmp_path):
    model, *_ = fresh()
    save_checkpoint(tmp_path, 3, model.state_dict(), config=TINY)
    save_checkpoint(tmp_path, 3, {k: v + 1 for k, v in model.state_dict().items()}, config=TINY)
    loaded = GLMModel(TINY)
    load_checkpoint(tmp_path, loaded)
    torch.testing.assert_close(loaded.word_embeddings.weight, model.word_embeddings.weight + 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["3", TRACKER]


def upstream_checkpoint(directory, weights, iteration=100):
    """What upstream's save_checkpoint writes (without the apex optimizer state)."""
    (directory / str(iteration)).mkdir(parents=True)
    torch.save({"iteration": iteration, "module": weights},
               directory / str(iteration) / "mp_rank_00_model_states.pt")
    (directory / TRACKER).write_text(str(iteration))


def test_loads_upstream_checkpoint_layout(tmp_path):
    source = GLMModel(TINY)
    upstream_checkpoint(tmp_path, source.state_dict())
    target = GLMModel(TINY)
    assert load_checkpoint(tmp_path, target) == 0  # foreign file: weights only, a new run
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value), key
    # The iteration directory and the file itself work too.
    load_checkpoint(tmp_path / "100", target)
    load_checkpoint(tmp_path / "100" / "mp_rank_00_model_states.pt", target)


def test_loads_hugging_face_weights(tmp_path):
    source = GLMModel(TINY)
    weights = {"glm." + k: v for k, v in source.state_dict().items()}
    torch.save(weights, tmp_path / "pytorch_model.bin")
    target = GLMModel(TINY)
    load_checkpoint(tmp_path / "pytorch_model.bin", target)
    assert torch.equal(target.word_embeddings.weight, source.word_embeddings.weight)


def test_other_architecture_is_a_one_line_error(tmp_path):
    upstream_checkpoint(tmp_path, GLMModel(TINY.replace(hidden_size=64)).state_dict())
    model = GLMModel(TINY)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(tmp_path, model)
    message = str(error.value)
    assert "\n" not in message
    assert "does not fit this model: word_embeddings.weight is [64, 64] there, [64, 32] here" in message
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())

    deeper = tmp_path / "deeper"
    upstream_checkpoint(deeper, GLMModel(TINY.replace(num_layers=1)).state_dict())
    with pytest.raises(CheckpointError, match="lacks 12 of the model's weights, e.g. transformer.layers.1"):
        load_checkpoint(deeper, model)


def test_a_shard_of_another_tensor_parallel_size_says_so(tmp_path):
    """Rank 0's file of a tensor-parallel 2 save (half the embedding rows, ``mp_world_size`` 2) resumed in one
    process: the mismatch names both sizes, not only the shapes."""
    half = {k: (v[: v.shape[0] // 2] if k == "word_embeddings.weight" else v)
            for k, v in GLMModel(TINY).state_dict().items()}
    (tmp_path / "100").mkdir()
    torch.save({"iteration": 100, "module": half, "mp_world_size": 2}, tmp_path / "100" / "mp_rank_00_model_states.pt")
    (tmp_path / TRACKER).write_text("100")
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(tmp_path, GLMModel(TINY))
    message = str(error.value)
    assert "\n" not in message and message.endswith(
        " here (saved at tensor parallel 2, this run is at tensor parallel 1: resume at 2)"), message


def test_missing_and_empty_checkpoint_paths(tmp_path):
    model = GLMModel(TINY)
    with pytest.raises(CheckpointError, match="no such file or directory"):
        load_checkpoint(tmp_path / "nope", model)
    with pytest.raises(CheckpointError, match="no checkpoint there"):
        load_checkpoint(tmp_path, model)
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_checkpoint(tmp_path / "garbage.pt", model)


def test_debris_of_a_killed_save_is_cleared_by_the_next_save_and_load(tmp_path):
    """``kill -9`` during a save leaves a staging ``.tmp-N`` (a 0-byte file in it, or a 0-byte ``.tmp-N``)."""
    model, *_ = fresh()
    save_checkpoint(tmp_path, 1, model.state_dict(), config=TINY)

    def debris():
        (tmp_path / ".tmp-2").mkdir()
        (tmp_path / ".tmp-2" / "mp_rank_00_model_states.pt").write_bytes(b"")
        (tmp_path / ".tmp-9").write_bytes(b"")
        (tmp_path / f".{TRACKER}.tmp").write_bytes(b"")

    debris()
    save_checkpoint(tmp_path, 3, model.state_dict(), config=TINY)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "3", TRACKER]
    debris()
    load_checkpoint(tmp_path, GLMModel(TINY))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "3", TRACKER]
    # Killed between the two renames of re-saving iteration 3: the old copy is put back, not dropped.
    os.replace(tmp_path / "3", tmp_path / ".old-3")
    assert load_checkpoint(tmp_path, GLMModel(TINY)) == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "3", TRACKER]


def test_corrupt_or_missing_latest_points_at_the_previous_intact_one(tmp_path):
    model, *_ = fresh()
    for iteration in (1, 2, 3):
        save_checkpoint(tmp_path, iteration, model.state_dict(), config=TINY)
    for iteration in (2, 3):
        file = tmp_path / str(iteration) / "mp_rank_00_model_states.pt"
        file.write_bytes(file.read_bytes()[:-100])  # 2 is damaged too: the hint skips it
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(tmp_path, GLMModel(TINY))
    assert str(error.value).endswith(f"; the previous checkpoint, iteration 1, is intact: --load {tmp_path / '1'}")
    (tmp_path / TRACKER).write_text("7")
    with pytest.raises(CheckpointError, match="no checkpoint there .*; the previous checkpoint, iteration 1, is"):
        load_checkpoint(tmp_path, GLMModel(TINY))
    (tmp_path / "1" / "mp_rank_00_model_states.pt").unlink()
    with pytest.raises(CheckpointError) as error:
        load_checkpoint(tmp_path, GLMModel(TINY))
    assert "previous" not in str(error.value)  # none left to point at


def test_model_parallel_rng_tracker_state_is_saved_and_restored(tmp_path):
    """Tensor-parallel attention dropout draws from the tracker's stream: resuming must replay it too."""
    from shim.checkpointing import get_cuda_rng_tracker, model_parallel_cuda_manual_seed

    tracker = get_cuda_rng_tracker()
    model_parallel_cuda_manual_seed(1234)
    try:
        with tracker.fork():
            torch.rand(5)  # the stream has moved on from its seed
        model, *_ = fresh()
        save_checkpoint(tmp_path, 1, model.state_dict(), config=TINY)
        with tracker.fork():
            expected = torch.rand(5)
        model_parallel_cuda_manual_seed(99)
        load_checkpoint(tmp_path, GLMModel(TINY))
        with tracker.fork():
            assert torch.equal(torch.rand(5), expected)
    finally:
        tracker.reset()


def test_tracker_file_is_published_last_by_rename(tmp_path, monkeypatch):
    """The tracker names an iteration only once its directory is complete, and is never written in place."""
    model, *_ = fresh()
    save_checkpoint(tmp_path, 1, model.state_dict(), config=TINY)
    published = []
    real_replace = os.replace

    def replace(src, dst):
        if Path(dst) == tmp_path / TRACKER:
            assert (tmp_path / TRACKER).read_text() == "1", "the tracker changed before its rename"
            assert (tmp_path / "2" / "mp_rank_00_model_states.pt").is_file(), "published before the directory"
            assert not (tmp_path / ".tmp-2").exists()
            published.append(Path(src).read_text())
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    save_checkpoint(tmp_path, 2, model.state_dict(), config=TINY)
    assert published == ["2"] and (tmp_path / TRACKER).read_text() == "2"


def test_save_flushes_and_fsyncs_the_file_and_the_directories(tmp_path, monkeypatch):
    model, *_ = fresh()
    synced = []
    real_fsync = os.fsync

    def fsync(fd):
        st = os.fstat(fd)
        synced.append((st.st_ino, st.st_size))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    save_checkpoint(tmp_path, 4, model.state_dict(), config=TINY)
    file = os.stat(tmp_path / "4" / "mp_rank_00_model_states.pt")
    assert (file.st_ino, file.st_size) in synced  # synced whole: flushed before the fsync
    tracker = os.stat(tmp_path / TRACKER)
    assert (tracker.st_ino, tracker.st_size) == (tracker.st_ino, 1) and (tracker.st_ino, 1) in synced
    directories = {os.stat(tmp_path).st_ino, os.stat(tmp_path / "4").st_ino}  # the renames, and the tracker's
    assert directories <= {ino for ino, _ in synced}
