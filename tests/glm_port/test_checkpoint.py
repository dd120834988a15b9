"""Checkpoints: upstream's layout, atomic saves, exact resume, upstream/HF weights, clear errors."""

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


def test_missing_and_empty_checkpoint_paths(tmp_path):
    model = GLMModel(TINY)
    with pytest.raises(CheckpointError, match="no such file or directory"):
        load_checkpoint(tmp_path / "nope", model)
    with pytest.raises(CheckpointError, match="no checkpoint there"):
        load_checkpoint(tmp_path, model)
    (tmp_path / "garbage.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable checkpoint"):
        load_checkpoint(tmp_path / "garbage.pt", model)
