"""The shared weights reader (``glm_port.models.weights_io``): every file layout a family's weights come in, found
and read by name (a rank's tensor-parallel slice read as a slice of the file), and each failure one line naming
the file."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from glm_port.models import WeightsError
from glm_port.models.weights_io import Adapter, TensorFile, Tensors, find_layout, iter_rank_tensors, open_tensors

STATE = {"a.weight": torch.arange(24, dtype=torch.float32).reshape(6, 4), "b.bias": torch.arange(3.0),
         "c.inv_freq": torch.ones(2)}


def write_hf(directory, fmt: str, shards: int, state=STATE):
    """``state`` as transformers lays it out: one file, or ``shards`` files with an index."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text("{}")
    base, ext = ("model", "safetensors") if fmt == "safetensors" else ("pytorch_model", "bin")
    names = list(state)
    groups = [names[i::shards] for i in range(shards)]
    weight_map = {}
    for i, group in enumerate(groups):
        name = f"{base}.{ext}" if shards == 1 else f"{base}-{i + 1:05d}-of-{shards:05d}.{ext}"
        part = {k: state[k] for k in group}
        save_file(part, str(directory / name)) if fmt == "safetensors" else torch.save(part, directory / name)
        weight_map.update(dict.fromkeys(group, name))
    if shards > 1:
        (directory / f"{base}.{ext}.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return directory


def write_ranks(directory, parts: list[dict], tracker: bool = False, **extra):
    """One ``mp_rank_XX_model_states.pt`` per rank (the project's saves and upstream's: weights under 'module')."""
    target = directory / "7" if tracker else directory
    target.mkdir(parents=True)
    for rank, part in enumerate(parts):
        torch.save({"module": part, "mp_world_size": len(parts), **extra},
                   target / f"mp_rank_{rank:02d}_model_states.pt")
    if tracker:
        (directory / "latest_checkpointed_iteration.txt").write_text("7")
    return directory


def rows(name, tensor, size, rank):  # a split plan that cuts every tensor by rows (a safetensors slice or a tensor)
    length = (tensor.get_shape() if not isinstance(tensor, torch.Tensor) else tensor.shape)[0]
    step = length // size
    return tensor[rank * step:(rank + 1) * step]


def join(name, parts, files):
    return torch.cat(parts, dim=0)


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@pytest.mark.parametrize("shards", [1, 2])
def test_each_hf_layout_is_found_and_read_by_name(tmp_path, fmt, shards):
    directory = write_hf(tmp_path / "model", fmt, shards)
    layout = find_layout(directory)
    assert layout.kind == "hf" and len(layout.files) == shards and layout.tp_size == 1
    assert layout.config_file == directory / "config.json"
    assert (layout.index is not None) == (shards > 1)
    tensors = Tensors(layout)
    assert sorted(tensors.keys()) == sorted(STATE)
    for name, tensor in STATE.items():
        assert torch.equal(tensors[name], tensor) and tensors.shape(name) == list(tensor.shape)
    # a file given by its path is the same layout, one file
    single = find_layout(layout.files[0])
    assert single.kind == "hf" and single.files == [layout.files[0]]


def test_an_adapter_renames_and_drops_names(tmp_path):
    adapter = Adapter(to_model=lambda k: None if k.endswith("inv_freq") else "model." + k,
                      to_checkpoint=lambda k: k.removeprefix("model."))
    tensors = open_tensors(write_hf(tmp_path / "m", "safetensors", 2), adapter.to_model)
    assert sorted(tensors.keys()) == ["model.a.weight", "model.b.bias"]
    assert torch.equal(tensors["model.a.weight"], STATE["a.weight"])
    assert adapter.to_checkpoint("model.a.weight") == "a.weight"


def test_a_safetensors_slice_reads_only_the_rank_part(tmp_path):
    directory = write_hf(tmp_path / "m", "safetensors", 1)
    got = dict(iter_rank_tensors(find_layout(directory), rows, join, tp_size=2, tp_rank=1))
    assert torch.equal(got["a.weight"], STATE["a.weight"][3:])
    assert torch.equal(got["b.bias"], STATE["b.bias"][1:2])


@pytest.mark.parametrize("saved,run", [(2, 2), (2, 1), (1, 2), (4, 2), (2, 4)])
def test_rank_files_at_any_size_give_each_rank_its_slice(tmp_path, saved, run):
    state = {"w": torch.arange(32.0).reshape(8, 4)}
    parts = [{"w": state["w"].chunk(saved)[r].clone()} for r in range(saved)]
    layout = find_layout(write_ranks(tmp_path / "ckpt", parts, tracker=True))
    assert layout.kind == "ranks" and layout.tp_size == saved and layout.directory == tmp_path / "ckpt" / "7"
    for rank in range(run):
        got = dict(iter_rank_tensors(layout, rows, join, tp_size=run, tp_rank=rank))
        assert torch.equal(got["w"], state["w"].chunk(run)[rank])


def test_a_rank_file_carries_its_config(tmp_path):
    write_ranks(tmp_path / "ckpt", [{"w": torch.ones(2)}], glm_config={"num_layers": 3})
    file = TensorFile(tmp_path / "ckpt" / "mp_rank_00_model_states.pt")
    assert list(file.keys()) == ["w"] and file.config() == {"num_layers": 3}
    assert find_layout(tmp_path / "ckpt" / "mp_rank_00_model_states.pt").kind == "ranks"


def one_line(error) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    return message


def test_a_truncated_safetensors_file_is_one_line_naming_it(tmp_path):
    directory = write_hf(tmp_path / "m", "safetensors", 2)
    shard = directory / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:-8])
    with pytest.raises(WeightsError) as error:
        find_layout(directory)
    assert one_line(error).startswith(f"{shard}: not a readable safetensors file")


def test_a_corrupt_bin_file_is_one_line_naming_it(tmp_path):
    directory = write_hf(tmp_path / "m", "bin", 1)
    weights = directory / "pytorch_model.bin"
    weights.write_bytes(b"not a checkpoint at all")
    with pytest.raises(WeightsError) as error:
        open_tensors(directory)
    assert one_line(error).startswith(f"{weights}: not a readable checkpoint")


def test_a_shard_missing_from_an_index_is_named(tmp_path):
    directory = write_hf(tmp_path / "m", "bin", 2)
    (directory / "pytorch_model-00001-of-00002.bin").unlink()
    with pytest.raises(WeightsError) as error:
        find_layout(directory)
    assert one_line(error) == (f"{directory / 'pytorch_model-00001-of-00002.bin'}: shard listed in "
                               f"pytorch_model.bin.index.json is missing")


def test_an_index_that_is_not_one_is_named(tmp_path):
    directory = write_hf(tmp_path / "m", "safetensors", 2)
    (directory / "model.safetensors.index.json").write_text("{")
    with pytest.raises(WeightsError) as error:
        find_layout(directory)
    assert one_line(error).startswith(f"{directory / 'model.safetensors.index.json'}: not valid JSON")


@pytest.mark.parametrize("text", ['["weight_map"]', '{"weight_map": {"w": 3}}', '{"weight_map": ["a.safetensors"]}'])
def test_an_index_of_another_shape_is_one_line(tmp_path, text):
    # valid JSON, but no {name: file} weight_map (it was an AttributeError or TypeError traceback)
    directory = write_hf(tmp_path / "m", "safetensors", 2)
    (directory / "model.safetensors.index.json").write_text(text)
    with pytest.raises(WeightsError) as error:
        find_layout(directory)
    assert one_line(error) == f"{directory / 'model.safetensors.index.json'}: not a weight index (no 'weight_map')"


def test_a_missing_rank_file_and_mixed_ranks_are_named(tmp_path):
    parts = [{"w": torch.ones(2, 2)} for _ in range(3)]
    write_ranks(tmp_path / "gap", parts)
    (tmp_path / "gap" / "mp_rank_01_model_states.pt").unlink()
    with pytest.raises(WeightsError) as error:
        find_layout(tmp_path / "gap")
    assert "mp_rank_01_model_states.pt is missing" in one_line(error)
    write_ranks(tmp_path / "mixed", [{"w": torch.ones(2, 2)}, {"v": torch.ones(2, 2)}])
    with pytest.raises(WeightsError) as error:
        list(iter_rank_tensors(find_layout(tmp_path / "mixed"), rows, join, tp_size=1))
    assert "mp_rank_01_model_states.pt lacks w" in one_line(error)


def test_nothing_there_is_one_line(tmp_path):
    with pytest.raises(WeightsError) as error:
        find_layout(tmp_path / "absent")
    assert one_line(error) == f"{tmp_path / 'absent'}: no such file or directory"
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightsError) as error:
        find_layout(tmp_path / "empty", "GLM")
    assert one_line(error).startswith(f"{tmp_path / 'empty'} holds no GLM weights")
    (tmp_path / "tracked").mkdir()
    (tmp_path / "tracked" / "latest").write_text("9")
    with pytest.raises(WeightsError) as error:
        find_layout(tmp_path / "tracked")
    assert "its checkpoint tracker points at" in one_line(error)


def test_a_rank_file_without_weights_is_named(tmp_path):
    (tmp_path / "ckpt").mkdir()
    torch.save({"iteration": 3}, tmp_path / "ckpt" / "mp_rank_00_model_states.pt")
    with pytest.raises(WeightsError) as error:
        TensorFile(tmp_path / "ckpt" / "mp_rank_00_model_states.pt")
    path = tmp_path / "ckpt" / "mp_rank_00_model_states.pt"
    assert one_line(error) == f"{path}: holds no model weights ('module' missing)"


def test_each_familys_adapter_maps_its_names_both_ways():
    """GLM: upstream's names (either spelling in a file) <-> the model's ``glm.`` names; ChatGLM2 (GLM-4 too):
    THUDM's names are the model's, the constant rotary buffer dropped; transformers' ``glm`` layout there and
    back gives every tensor again."""
    from glm_port.models.chatglm2.adapter import ADAPTER as CHATGLM2
    from glm_port.models.chatglm2.adapter import from_glm_plan, to_glm_plan
    from glm_port.models.chatglm2.tiny import build_tiny
    from glm_port.models.glm.adapter import ADAPTER as GLM
    from glm_port.models.glm.hf import GLMForConditionalGeneration, GLMPretrainedConfig

    with torch.device("meta"):
        glm = GLMForConditionalGeneration(GLMPretrainedConfig(num_layers=2, hidden_size=64, num_attention_heads=4,
                                                              vocab_size=256, max_sequence_length=32))
    for name in glm.state_dict():
        stored = GLM.to_checkpoint(name)
        assert not stored.startswith("glm.") and GLM.to_model(stored) == name == GLM.to_model("glm." + stored)
    model, _ = build_tiny()
    state = dict(model.state_dict())
    assert all(CHATGLM2.to_model(CHATGLM2.to_checkpoint(n)) == n for n in state)
    assert CHATGLM2.to_model("transformer.rotary_pos_emb.inv_freq") is None
    there = {n: read() for n, read in to_glm_plan(model.config, state)}
    assert "model.layers.0.self_attn.k_proj.weight" in there and not any("query_key_value" in n for n in there)
    back = {n: read() for n, read in from_glm_plan(model.config, there)}
    assert back.keys() == state.keys() and all(torch.equal(back[n], state[n]) for n in state)


def test_a_rank_file_that_needs_unpickling_is_read_only_where_asked(tmp_path):
    """Upstream GLM's rank files pickle numpy RNG state beside the weights: GLM's reader unpickles them
    (``unpickle=True``), as upstream does; every other reader (ChatGLM2's, GLM-4's shards: the project's own,
    ``weights_only`` loadable) refuses such a file in one line, so no code in it runs."""
    import numpy as np

    directory = write_ranks(tmp_path / "ranks", [{"a.weight": STATE["a.weight"]}],
                            np_rng_state=np.random.RandomState(0).get_state())
    path = directory / "mp_rank_00_model_states.pt"
    torch.testing.assert_close(TensorFile(path, unpickle=True).get("a.weight"), STATE["a.weight"])
    layout = find_layout(directory)
    assert [n for n, _ in iter_rank_tensors(layout, None, None, unpickle=True)] == ["a.weight"]
    with pytest.raises(WeightsError) as error:
        TensorFile(path)
    assert str(error.value).startswith(f"{path}: not a readable checkpoint (") and "\n" not in str(error.value)
    with pytest.raises(WeightsError):
        list(iter_rank_tensors(layout, None, None))
