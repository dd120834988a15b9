"""ChatGLM2 tensor-parallel shards back into one THUDM directory: ``tensor_parallel_merge`` undoes
``tensor_parallel_slice`` exactly (replicated key/value groups included), glm-merge writes what
``load_pretrained`` reads, the shard directory itself loads, and bad shards are one line, exit 2, nothing written.
(glm-finetune's own TP 2 / TP 4 shards are merged in tests/glm_port/test_finetune.py.)"""

import json

import pytest
import torch

from glm_port.checkpoint_io import TRACKER, model_file_name
from glm_port.convert.merge import main as merge_main
from glm_port.models.chatglm2.weights import (WeightsError, load_pretrained, tensor_parallel_merge,
                                              tensor_parallel_slice)


@pytest.mark.parametrize("overrides, size", [
    ({}, 1), ({}, 2), ({}, 4),  # 4 heads in 2 key/value groups: at 4 ranks each group is held by 2
    ({"multi_query_group_num": 1}, 4),  # one group on all 4 ranks
    ({"multi_query_attention": False, "add_bias_linear": True}, 2),  # per-head [q; k; v]; biases everywhere
    ({"multi_query_attention": False, "add_bias_linear": True}, 4),
])
def test_merge_is_the_exact_inverse_of_the_split(make_model, overrides, size):
    model = make_model(**overrides)
    config = model.config
    replicated = 0
    for name, full in model.state_dict().items():
        parts = [tensor_parallel_slice(name, full, config, rank, size) for rank in range(size)]
        assert torch.equal(tensor_parallel_merge(name, parts, config), full), name
        if ".query_key_value." in name and config.multi_query_attention and size > config.multi_query_group_num:
            replicated += 1
            d, heads = config.kv_channels, config.num_attention_heads
            k_rows = slice(heads // size * d, heads // size * d + d)  # rank 0's and rank 1's group: the same one
            assert torch.equal(parts[0][k_rows], parts[1][k_rows])
    assert replicated == (2 * config.num_layers if size > config.num_key_value_heads and config.multi_query_attention
                          else 0)


def test_merge_refuses_parts_that_are_not_one_tensors_slices(make_model):
    model = make_model()
    config = model.config
    name = "transformer.encoder.layers.0.self_attention.query_key_value.weight"
    full = model.state_dict()[name]
    parts = [tensor_parallel_slice(name, full, config, rank, 4).clone() for rank in range(4)]
    key_rows = slice(16, 32)  # rank r: 1 query head of 16 rows, then its group's K, V
    rounded = [p.clone() for p in parts]
    rounded[1][key_rows] *= 1 + 1e-6  # a copy a rounding apart (GPU sums): the first rank's is taken
    assert torch.equal(tensor_parallel_merge(name, rounded, config), full)
    halves = [p.to(torch.bfloat16) for p in parts]
    copy = halves[1][key_rows]
    halves[1][key_rows] = torch.nextafter(copy, torch.full_like(copy, float("inf")))  # bf16: one unit apart
    assert not torch.equal(halves[1][key_rows], halves[0][key_rows])
    assert torch.equal(tensor_parallel_merge(name, halves, config), full.to(torch.bfloat16))
    parts[1][key_rows] += 0.1  # a copy that is not the first's
    with pytest.raises(WeightsError, match=r"rank 1's copy differs from the first rank's by up to 0.1"):
        tensor_parallel_merge(name, parts, config)
    two = [tensor_parallel_slice(name, full, config, rank, 2) for rank in range(2)]
    with pytest.raises(WeightsError, match=r"parts of shapes|rank \d's part is"):
        tensor_parallel_merge(name, [parts[0], two[1], parts[2], parts[3]], config)
    norm = "transformer.encoder.final_layernorm.weight"
    whole = model.state_dict()[norm]
    with pytest.raises(WeightsError, match="rank 2's copy differs"):
        tensor_parallel_merge(norm, [whole, whole, whole + 1, whole], config)


# ---- shard checkpoints, as glm-finetune --tensor_parallel_degree writes them ---------------------------------

def write_shards(model, directory, size, step=7):
    """``directory/<step>/mp_rank_XX_model_states.pt`` (each rank's slices under ``'module'``, the config under
    ``'glm_config'``) + the tracker, as ``checkpoint_io.save_checkpoint`` lays them out on each rank."""
    (directory / str(step)).mkdir(parents=True)
    for rank in range(size):
        module = {name: tensor_parallel_slice(name, full, model.config, rank, size).clone()
                  for name, full in model.state_dict().items()}
        torch.save({"iteration": step, "module": module, "glm_config": model.config.to_dict()},
                   directory / str(step) / model_file_name(rank))
    (directory / TRACKER).write_text(str(step))
    return directory


@pytest.fixture(scope="module")
def tiny_shards(tmp_path_factory, tiny):
    model, tokenizer = tiny
    root = tmp_path_factory.mktemp("shards")
    write_shards(model, root / "tp4", 4)
    tokenizer.save_pretrained(root / "tp4")
    return model, root


def _same_weights(loaded, model):
    state = model.state_dict()
    assert loaded.state_dict().keys() == state.keys()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, state[name]), name


def test_glm_merge_writes_thudms_layout_from_4_shards_with_replicated_groups(tiny_shards, tmp_path, capsys):
    model, root = tiny_shards
    merge_main([str(root / "tp4"), str(tmp_path / "merged")])
    out = capsys.readouterr().out
    assert "(4 tensor-parallel shards)" in out and "parameters in float32" in out, out
    config = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert config["model_type"] == "chatglm" and config["architectures"] == ["ChatGLM2ForCausalLM"]
    assert {p.name for p in (tmp_path / "merged").iterdir()} == {
        "config.json", "model.safetensors", "tokenizer.model", "tokenizer_config.json"}
    _same_weights(load_pretrained(tmp_path / "merged"), model)
    # The shard directory loads as it is too (its tracker, an iteration directory), merged in memory.
    _same_weights(load_pretrained(root / "tp4"), model)
    _same_weights(load_pretrained(root / "tp4" / "7"), model)
    # --dtype, and --overwrite replacing the directory whole.
    merge_main([str(root / "tp4"), str(tmp_path / "merged"), "--dtype", "bf16", "--overwrite"])
    from safetensors.torch import load_file

    stored = load_file(tmp_path / "merged" / "model.safetensors")
    assert {t.dtype for t in stored.values()} == {torch.bfloat16}
    assert json.loads((tmp_path / "merged" / "config.json").read_text())["dtype"] == "bfloat16"
    for name, tensor in model.state_dict().items():
        assert torch.equal(stored[name], tensor.to(torch.bfloat16)), name


def _break(src, case, model):
    step = src / "7"
    if case == "missing rank":
        (step / model_file_name(1)).unlink()
    elif case == "last rank missing":
        (step / model_file_name(3)).unlink()
    elif case == "another degree":  # rank 1 of a tensor-parallel 2 run among tensor-parallel 4 shards
        other = write_shards(model, src.parent / "tp2", 2)
        (other / "7" / model_file_name(1)).replace(step / model_file_name(1))
    elif case == "copies differ":  # rank 1's copy of key/value group 0 (rank 0 holds it too)
        checkpoint = torch.load(step / model_file_name(1), weights_only=True)
        checkpoint["module"]["transformer.encoder.layers.1.self_attention.query_key_value.bias"][16:32] += 1
        torch.save(checkpoint, step / model_file_name(1))
    elif case == "a weight missing":
        checkpoint = torch.load(step / model_file_name(2), weights_only=True)
        del checkpoint["module"]["transformer.output_layer.weight"]
        torch.save(checkpoint, step / model_file_name(2))


@pytest.mark.parametrize("case, message", [
    ("missing rank", "mp_rank_01_model_states.pt is missing (the checkpoint has 4 model-parallel ranks)"),
    ("last rank missing", "rank 0's slice at tensor parallel 3 of the saved config is"),
    ("another degree", "mp_rank_01_model_states.pt: transformer.encoder.layers.0.self_attention.query_key_value"),
    ("copies differ", "query_key_value.bias: rank 1's copy differs from the first rank's by up to 1"),
    ("a weight missing", "mp_rank_02_model_states.pt: weight transformer.output_layer.weight missing"),
])
def test_bad_shards_are_one_line_exit_2_and_nothing_written(tiny_shards, tmp_path, capsys, case, message):
    model, root = tiny_shards
    src = write_shards(model, tmp_path / "src", 4)
    for name in ("tokenizer.model", "tokenizer_config.json"):
        (src / name).write_bytes((root / "tp4" / name).read_bytes())
    _break(src, case, model)
    with pytest.raises(SystemExit) as exit_info:
        merge_main([str(src), str(tmp_path / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("glm-merge: error: ") and message in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src", "tp2"][:2 if case == "another degree" else 1]


def test_glm_merge_reads_glm_finetunes_periodic_checkpoints_alone(tmp_path, capsys):
    """glm-finetune --save_steps keeps the tokenizer beside its checkpoints, so glm-merge OUT/checkpoints needs no
    --tokenizer-path, and the merged last checkpoint is the model the run saved under final/."""
    from glm_port.finetune.run import main as finetune_main

    out = tmp_path / "run"
    finetune_main(["--model_name_or_path", "chatglm2-tiny", "--max_steps", "4", "--save_steps", "2", "--do_eval",
                   "false", "--learning_rate", "1e-2", "--output_dir", str(out)])
    assert merge_main([str(out / "checkpoints"), str(tmp_path / "merged")]) in (None, 0)
    merged, final = load_pretrained(tmp_path / "merged"), load_pretrained(out / "final")
    ids = torch.arange(5, 21).view(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(merged(ids).logits, final(ids).logits)
