"""GLM's config.json as the commands write it, and checkpoints' saved configs as they are read: the keys and
values below are what glm-merge, glm-export and glm-finetune wrote before GLM's two configs became one
(issue 27), so a change to the config class that changes a written file fails here."""

import json

import pytest
import torch

from glm_port import GLMConfig, GLMModel
from glm_port.checkpoint_io import save_checkpoint
from glm_port.convert import merge as merge_cli
from glm_port.data.tokenization import tiny_wordpiece
from glm_port.models.glm import finetune, weights
from glm_port.models.glm.hf import GLMForConditionalGeneration

VOCAB = tiny_wordpiece()
# A glm-pretrain run's config: the run settings (checkpointing, memory) set, which config.json never records.
PRETRAIN = dict(vocab_size=VOCAB.vocab_size, num_layers=1, hidden_size=32, num_attention_heads=2,
                max_sequence_length=16, init_method_std=0.3, checkpoint_activations=True, max_memory_length=4)
# transformers' own fields, as PretrainedConfig.to_dict gives them (glm-merge writes the whole dict).
TRANSFORMERS_FIELDS = {
    "output_hidden_states": False, "return_dict": True, "chunk_size_feed_forward": 0, "is_encoder_decoder": False,
    "id2label": {"0": "LABEL_0", "1": "LABEL_1"}, "label2id": {"LABEL_0": 0, "LABEL_1": 1}, "problem_type": None,
    "output_attentions": False,
}
GLM_FIELDS = {
    "model_type": "glm", "architectures": ["GLMForConditionalGeneration"], "dtype": "float32",
    "num_layers": 1, "vocab_size": VOCAB.vocab_size, "hidden_size": 32, "num_attention_heads": 2,
    "embedding_dropout_prob": 0.1, "attention_dropout_prob": 0.1, "output_dropout_prob": 0.1,
    "max_sequence_length": 16, "block_position_encoding": True, "relative_encoding": False, "attention_scale": 1.0,
    "layernorm_epsilon": 1e-05, "initializer_range": 0.3, "attention_impl": "fused", "spell_length": None,
    "intermediate_size": None, "tie_word_embeddings": True,
}
# THUDM's glm-large-chinese config.json, at a tiny size.
THUDM = {
    "architectures": ["GLMModel"], "attention_dropout_prob": 0.1, "attention_scale": 1.0,
    "auto_map": {"AutoConfig": "configuration_glm.GLMConfig"}, "block_position_encoding": True,
    "checkpoint_activations": False, "checkpoint_num_layers": 1, "embedding_dropout_prob": 0.1, "hidden_size": 32,
    "initializer_range": 0.02, "max_sequence_length": 16, "model_type": "glm", "num_attention_heads": 2,
    "num_layers": 1, "output_dropout_prob": 0.1, "output_predict": True, "parallel_output": True, "pool_token": "cls",
    "relative_encoding": False, "spell_func": "lstm", "spell_length": None, "torch_dtype": "float16",
    "transformers_version": "4.23.1", "vocab_size": VOCAB.vocab_size,
}
# The config dict glm-pretrain's checkpoints carried under 'glm_config' while GLMConfig was a dataclass.
DATACLASS_GLM_CONFIG = {
    "vocab_size": VOCAB.vocab_size, "num_layers": 1, "hidden_size": 32, "num_attention_heads": 2,
    "max_sequence_length": 16, "embedding_dropout_prob": 0.1, "attention_dropout_prob": 0.1,
    "output_dropout_prob": 0.1, "layernorm_epsilon": 1e-05, "init_method_std": 0.3, "intermediate_size": None,
    "max_memory_length": 4, "block_position_encoding": True, "checkpoint_activations": True,
    "checkpoint_num_layers": 1, "checkpoint_policy": "full", "attention_impl": "fused",
}


def written(path) -> dict:
    config = json.loads((path / "config.json").read_text())
    assert config.pop("transformers_version")
    return config


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return GLMModel(GLMConfig(**PRETRAIN))


def test_glm_merge_of_a_pretrain_checkpoint_writes_the_architecture_and_not_the_run_settings(tmp_path, model):
    save_checkpoint(tmp_path / "pretrain", 3, model.state_dict(), config=GLMConfig(**PRETRAIN))
    merge_cli.main([str(tmp_path / "pretrain"), str(tmp_path / "merged")])
    assert written(tmp_path / "merged") == {**GLM_FIELDS, **TRANSFORMERS_FIELDS}


def test_a_checkpoint_with_the_dataclass_config_of_before_still_loads(tmp_path, model):
    """glm-pretrain checkpoints written while GLMConfig was a dataclass: its fields (``init_method_std``, the run
    settings) read as they were; the run settings do not reach the loaded model, as before."""
    directory = tmp_path / "old" / "3"
    directory.mkdir(parents=True)
    (tmp_path / "old" / "latest_checkpointed_iteration.txt").write_text("3")
    torch.save({"module": model.state_dict(), "iteration": 3, "glm_config": DATACLASS_GLM_CONFIG},
               directory / "mp_rank_00_model_states.pt")
    loaded = GLMForConditionalGeneration.from_pretrained(tmp_path / "old")
    config = loaded.glm.config
    assert (config.vocab_size, config.num_layers, config.hidden_size, config.num_attention_heads,
            config.max_sequence_length, config.init_method_std) == (VOCAB.vocab_size, 1, 32, 2, 16, 0.3)
    assert (config.checkpoint_activations, config.max_memory_length) == (False, 0)
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.glm.state_dict()[name], tensor), name
    merge_cli.main([str(tmp_path / "old"), str(tmp_path / "merged")])
    assert written(tmp_path / "merged") == {**GLM_FIELDS, **TRANSFORMERS_FIELDS}


def test_glm_finetune_saves_the_config_json_of_before(tmp_path, model):
    finetune.save(model, VOCAB, tmp_path / "saved", None)
    assert written(tmp_path / "saved") == GLM_FIELDS


def test_glm_merge_of_a_thudm_directory_keeps_its_fields(tmp_path, model):
    weights.save_hf(model.state_dict(), tmp_path / "thudm", THUDM)
    merge_cli.main([str(tmp_path / "thudm"), str(tmp_path / "merged")])
    kept = {k: THUDM[k] for k in ("checkpoint_activations", "checkpoint_num_layers", "output_predict",
                                  "parallel_output", "pool_token", "spell_func")}
    assert written(tmp_path / "merged") == {**GLM_FIELDS, **TRANSFORMERS_FIELDS, **kept, "initializer_range": 0.02}


# ---- one class -------------------------------------------------------------------------------------------
# A value other than the default for every field GLMConfig takes (its __init__'s keywords).
CHANGED = dict(vocab_size=64, num_layers=3, hidden_size=48, num_attention_heads=6, max_sequence_length=40,
               embedding_dropout_prob=0.2, attention_dropout_prob=0.3, output_dropout_prob=0.4, layernorm_epsilon=1e-6,
               initializer_range=0.05, intermediate_size=100, block_position_encoding=False, attention_impl="sdpa",
               relative_encoding=True, attention_scale=2.0, spell_length=3, max_memory_length=5,
               checkpoint_activations=True, checkpoint_num_layers=2, checkpoint_policy="selective")


def test_glm_has_one_config_class_and_its_model_shares_the_config():
    import glm_port
    from glm_port.models.glm import config as glm_config, hf

    assert GLMForConditionalGeneration.config_class is GLMConfig
    for module in (glm_config, hf, glm_port):  # the transformers config's name before issue 27: this class
        with pytest.warns(DeprecationWarning, match="GLMPretrainedConfig is now .*GLMConfig"):
            assert module.GLMPretrainedConfig is GLMConfig
    config = GLMConfig(**PRETRAIN)
    model = GLMForConditionalGeneration(config)
    assert model.config is config and model.glm.config is config
    assert config.init_method_std == config.initializer_range == 0.3  # glm_port's name for config.json's


def test_every_field_but_the_run_settings_survives_save_pretrained(tmp_path):
    import inspect

    from glm_port.models.glm.config import RUN_SETTINGS

    taken = set(inspect.signature(GLMConfig.__init__).parameters) - {"self", "kwargs"}
    assert set(CHANGED) == taken  # a field added to GLMConfig is added here
    config = GLMConfig(**CHANGED)
    assert all(getattr(config, name) == value for name, value in CHANGED.items())
    config.save_pretrained(tmp_path)
    assert not set(RUN_SETTINGS) & set(json.loads((tmp_path / "config.json").read_text()))
    read = GLMConfig.from_pretrained(tmp_path)
    defaults = GLMConfig()
    for name, value in CHANGED.items():
        assert getattr(read, name) == (getattr(defaults, name) if name in RUN_SETTINGS else value), name


def test_replace_gives_a_checked_copy():
    config = GLMConfig(**PRETRAIN)
    recomputed = config.replace(checkpoint_activations=False, init_method_std=0.1)
    assert (recomputed.checkpoint_activations, recomputed.initializer_range) == (False, 0.1)
    assert (config.checkpoint_activations, config.initializer_range) == (True, 0.3)
    with pytest.raises(TypeError, match="rotary"):
        config.replace(rotary=True)
    with pytest.raises(ValueError, match="not divisible by 3 attention heads"):
        config.replace(num_attention_heads=3)


def test_configs_equal_by_every_field():
    assert GLMConfig(**PRETRAIN) == GLMConfig(**PRETRAIN)
    assert GLMConfig(**PRETRAIN) != GLMConfig(**{**PRETRAIN, "num_layers": 2})
    assert GLMConfig(**PRETRAIN) != GLMConfig(**{**PRETRAIN, "checkpoint_activations": False})


@pytest.mark.parametrize("field, value, reason", [
    ("relative_encoding", True, "relative_encoding"),
    ("attention_scale", 2.0, "attention_scale 2.0"),
    ("spell_length", 4, "spell_length"),
    ("num_attention_heads", 3, "not divisible"),  # set after the config was made, as overrides are
])
def test_the_model_refuses_what_it_does_not_run(field, value, reason):
    config = GLMConfig(**PRETRAIN)
    setattr(config, field, value)
    with pytest.raises(ValueError, match=reason):
        GLMModel(config)
