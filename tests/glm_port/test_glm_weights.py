"""Loading GLM weights from every form: HF directories (safetensors, sharded, .bin, with and without the
glm. prefix), upstream mp_rank files at MP 2 loaded at TP 1 and the reverse, glm-pretrain --save, errors."""

import json

import pytest
import torch

from glm_port import GLMConfig, GLMModel
from glm_port.checkpoint_io import save_checkpoint
from glm_port.models.glm import weights
from glm_port.models.glm.hf import GLMForConditionalGeneration, GLMPretrainedConfig

CONFIG = GLMPretrainedConfig(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=256,
                             max_sequence_length=32)
IDS = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(0))
SEP = torch.tensor([3, 5])


@pytest.fixture(scope="module")
def reference():
    torch.manual_seed(0)
    return GLMForConditionalGeneration(CONFIG).eval()


def upstream_state(model) -> dict:
    """Upstream's key names (no prefix), as in mp_rank files and THUDM's HF weight files."""
    return {k[len("glm."):]: v for k, v in model.state_dict().items()}


def logits(model):
    return model(IDS, attention_mask=SEP).logits


@pytest.mark.parametrize("shards,safetensors,prefix", [(1, True, "glm."), (3, True, ""), (1, False, ""),
                                                       (2, False, "glm.")])
def test_hf_directories(tmp_path, reference, shards, safetensors, prefix):
    weights.save_hf(upstream_state(reference), tmp_path / "hf", CONFIG.to_dict(), shards=shards,
                    safetensors=safetensors, prefix=prefix)
    loaded = GLMForConditionalGeneration.from_pretrained(tmp_path / "hf")
    assert torch.equal(logits(loaded), logits(reference))
    assert not loaded.training


def test_from_pretrained_refuses_unknown_arguments(tmp_path, reference):
    weights.save_hf(upstream_state(reference), tmp_path / "hf", CONFIG.to_dict())
    with pytest.raises(TypeError, match="unexpected arguments: device_map"):
        GLMForConditionalGeneration.from_pretrained(tmp_path / "hf", device_map="auto")
    loaded = GLMForConditionalGeneration.from_pretrained(tmp_path / "hf", torch_dtype=torch.bfloat16)
    assert loaded.dtype == torch.bfloat16


def test_dtype_and_thudm_config_fields(tmp_path, reference):
    config = {"architectures": ["GLMModel"], "model_type": "glm", "num_layers": 2, "hidden_size": 64,
              "num_attention_heads": 4, "vocab_size": 256, "max_sequence_length": 32, "attention_scale": 1.0,
              "block_position_encoding": True, "checkpoint_activations": False, "output_predict": True,
              "auto_map": {"AutoModelForSeq2SeqLM": "modeling_glm.GLMForConditionalGeneration"}}
    weights.save_hf(upstream_state(reference), tmp_path / "hf", config)
    loaded = GLMForConditionalGeneration.from_pretrained(tmp_path / "hf", dtype="bf16")
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16}
    torch.testing.assert_close(logits(loaded).float(), logits(reference), atol=0.15, rtol=0.05)


def write_mp(tmp_path, state, size, name="mp"):
    directory = tmp_path / name / "1000"
    directory.mkdir(parents=True)
    (tmp_path / name / "latest_checkpointed_iteration.txt").write_text("1000")
    for rank in range(size):
        part = {k: weights.take_slice(k, v, size, rank).clone() for k, v in state.items()}
        torch.save({"module": part, "iteration": 1000}, directory / f"mp_rank_{rank:02d}_model_states.pt")
    return tmp_path / name


def test_files_without_an_architecture_say_the_head_count_they_assume(tmp_path, reference, caplog):
    # upstream's mp_rank files carry no config: the head count is a guess (64-wide heads), which must be said,
    # since a model with other heads loads without an error and computes something else
    write_mp(tmp_path, upstream_state(reference), 1)
    with caplog.at_level("WARNING", logger="glm_port"):
        loaded = GLMForConditionalGeneration.from_pretrained(tmp_path / "mp")
    assert loaded.config.num_attention_heads == 1  # hidden 64: one 64-wide head, not the reference's 4
    assert "assuming 1 attention heads" in caplog.text and "num_attention_heads" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="glm_port"):
        told = GLMForConditionalGeneration.from_pretrained(tmp_path / "mp", num_attention_heads=4)
    assert "assuming" not in caplog.text
    assert torch.equal(logits(told), logits(reference))


def test_megatron_split_rules_by_hand():
    h = 4
    qkv = torch.arange(3 * h).float()  # Q = 0..3, K = 4..7, V = 8..11
    assert weights.take_slice("transformer.layers.0.attention.query_key_value.bias", qkv, 2, 1).tolist() == [
        2, 3, 6, 7, 10, 11]
    dense = torch.arange(8).view(2, 4)
    assert weights.take_slice("transformer.layers.0.attention.dense.weight", dense, 2, 0).tolist() == [[0, 1], [4, 5]]
    assert weights.take_slice("transformer.layers.0.mlp.dense_h_to_4h.weight", dense, 2, 1).tolist() == [[4, 5, 6, 7]]
    assert weights.take_slice("transformer.layers.0.attention.dense.bias", qkv, 2, 1) is qkv
    slices = [weights.take_slice("x.attention.query_key_value.bias", qkv, 2, r) for r in range(2)]
    assert torch.equal(weights.merge_slices("x.attention.query_key_value.bias", slices), qkv)


def test_mp2_checkpoint_loads_at_tp1(tmp_path, reference):
    path = write_mp(tmp_path, upstream_state(reference), 2)
    loaded = GLMForConditionalGeneration.from_pretrained(path)  # no config.json: shapes, heads 64 wide
    assert loaded.config.num_layers == 2 and loaded.config.vocab_size == 256
    assert loaded.config.max_sequence_length == 32 and loaded.config.num_attention_heads == 1
    loaded = GLMForConditionalGeneration.from_pretrained(path, num_attention_heads=4)
    assert torch.equal(logits(loaded), logits(reference))


@pytest.mark.parametrize("saved,run", [(1, 2), (2, 1), (2, 4), (4, 2), (3, 2)])
def test_resharding_gives_each_rank_its_megatron_slice(tmp_path, saved, run):
    state = {"word_embeddings.weight": torch.randn(12, 6),
             "transformer.layers.0.attention.query_key_value.weight": torch.randn(36, 12),
             "transformer.layers.0.attention.query_key_value.bias": torch.randn(36),
             "transformer.layers.0.attention.dense.weight": torch.randn(12, 12),
             "transformer.layers.0.mlp.dense_4h_to_h.weight": torch.randn(12, 48),
             "transformer.layers.0.mlp.dense_h_to_4h.bias": torch.randn(48),
             "transformer.final_layernorm.weight": torch.randn(12)}
    source = weights.find_source(write_mp(tmp_path, state, saved))
    assert source.mp_size == saved
    for rank in range(run):
        got = dict(weights.iter_tensors(source, run, rank))
        assert set(got) == set(state)
        for name, full in state.items():
            assert torch.equal(got[name], weights.take_slice(name, full, run, rank)), (name, rank)


def test_glm_pretrain_save_directory(tmp_path):
    config = GLMConfig(vocab_size=128, num_layers=2, hidden_size=32, num_attention_heads=4, max_sequence_length=16)
    torch.manual_seed(1)
    glm = GLMModel(config).eval()
    save_checkpoint(tmp_path / "ckpt", 20, glm.state_dict(), config=config)
    loaded = GLMForConditionalGeneration.from_pretrained(tmp_path / "ckpt")
    assert loaded.config.num_attention_heads == 4
    ids = IDS % 128
    (expected,) = glm(ids, torch.stack((torch.arange(7).expand(2, 7), torch.zeros(2, 7, dtype=torch.long)), 1), SEP)
    torch.testing.assert_close(loaded(ids, attention_mask=SEP).logits, expected)


def test_errors_name_the_problem(tmp_path, reference):
    state = upstream_state(reference)
    with pytest.raises(weights.WeightsError, match="holds no GLM weights"):
        weights.find_source(tmp_path)
    with pytest.raises(weights.WeightsError, match="no such file"):
        weights.find_source(tmp_path / "absent")
    weights.save_hf(state, tmp_path / "sharded", CONFIG.to_dict(), shards=2)
    next((tmp_path / "sharded").glob("model-00002*")).unlink()
    with pytest.raises(weights.WeightsError, match="model-00002-of-00002.safetensors: shard listed in model.safetensors.index.json is missing"):
        GLMForConditionalGeneration.from_pretrained(tmp_path / "sharded")
    partial = {k: v for k, v in state.items() if "layers.1.mlp" not in k}
    weights.save_hf(partial, tmp_path / "partial", CONFIG.to_dict())
    with pytest.raises(weights.WeightsError, match=r"missing 4 weight\(s\).*layers\.1\.mlp"):
        GLMForConditionalGeneration.from_pretrained(tmp_path / "partial")
    weights.save_hf(state, tmp_path / "vocab", {**CONFIG.to_dict(), "vocab_size": 512})
    with pytest.raises(weights.WeightsError, match=r"word_embeddings.weight is \[256, 64\] there, \[512, 64\]"):
        GLMForConditionalGeneration.from_pretrained(tmp_path / "vocab")
    write_mp(tmp_path, state, 2, name="gap")
    (tmp_path / "gap" / "1000" / "mp_rank_00_model_states.pt").unlink()
    with pytest.raises(weights.WeightsError, match="mp_rank_00_model_states.pt is missing"):
        weights.find_source(tmp_path / "gap")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text(json.dumps(CONFIG.to_dict()))
    (tmp_path / "bad" / "pytorch_model.bin").write_bytes(b"not a checkpoint")
    with pytest.raises(weights.WeightsError, match="not a readable checkpoint"):
        GLMForConditionalGeneration.from_pretrained(tmp_path / "bad")
