"""Issue 27: one name, one meaning. The renamed objects keep their old names importable, with a
DeprecationWarning naming the new one; the new names are distinct objects where the meanings differ."""

import importlib

import pytest

RENAMED = [
    ("glm_port.data", "GLMTokenizer", "GLMVocab"),
    ("glm_port.data.tokenization", "GLMTokenizer", "GLMVocab"),
    ("glm_port.data", "collate", "stack_batch"),
    ("glm_port.data.batches", "collate", "stack_batch"),
    ("glm_port.training", "collate", "pad_batch"),
    ("glm_port.models.glm.seq2seq", "collate", "pad_batch"),
]


@pytest.mark.parametrize("module, old, new", RENAMED)
def test_an_old_name_is_the_new_object_with_a_warning(module, old, new):
    namespace = importlib.import_module(module)
    with pytest.warns(DeprecationWarning, match=rf"{module}\.{old} is now {module}\.{new}"):
        assert getattr(namespace, old) is getattr(namespace, new)
    assert old not in vars(namespace)  # not a second definition: only the alias
    with pytest.raises(AttributeError):
        namespace.no_such_name  # noqa: B018


def test_each_name_is_one_thing():
    import glm_port
    from glm_port.data import GLMVocab, stack_batch
    from glm_port.models.glm import finetune
    from glm_port.training import pad_batch

    assert glm_port.GLMTokenizer is not GLMVocab
    assert glm_port.GLMTokenizer.__module__ == "glm_port.models.glm.tokenizer"
    assert len({pad_batch, stack_batch, finetune.collate}) == 3


def test_glm_layers_take_their_cache_slot_as_cache_index():
    import inspect

    from glm_port.models.glm.model import SelfAttention, TransformerLayer

    for layer in (SelfAttention, TransformerLayer):
        parameters = inspect.signature(layer.forward).parameters
        assert "cache_index" in parameters and "layer_index" not in parameters
