"""glm-convert on GLM-4 (the glm4 family's ``convert`` binding): THUDM's layout -> transformers' native ``glm``
directory (``GlmForCausalLM``, a ``tokenizer.json`` ``AutoTokenizer`` reads) and back, on a tiny GLM-4 whose every
weight is random."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from glm_port.convert.native import main as convert_main
from glm_port.models import FAMILIES, family_at
from glm_port.models.glm4 import GLM4ForCausalLM
from glm_port.models.glm4.tiny import tiny_config, write_directory
from glm_port.models.glm4.weights import load_pretrained, load_tokenizer

torch.set_num_threads(1)
IDS = torch.tensor([[3, 17, 250, 9, 511, 40, 961, 7, 88, 300, 2, 64]])
TEXTS = ("hello world", "你好，今天天气很好。\n  spaces  ", "[gMASK] as text <|user|>")
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "你好"}]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from glm_port.models.glm4.tiny import build_tokenizer

    return build_tokenizer(str(tmp_path_factory.mktemp("glm4-tok")))


@pytest.fixture(scope="module")
def model(tokenizer):
    model = GLM4ForCausalLM(tiny_config(tokenizer))
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def converted(model, tokenizer, tmp_path_factory):
    """``(thudm, hf, back)``: the tiny GLM-4 in THUDM's layout, glm-convert'ed to transformers' and back."""
    root = tmp_path_factory.mktemp("glm4-convert")
    thudm = write_directory(model, tokenizer, root / "thudm", "thudm")
    hf, back = root / "hf", root / "back"
    assert convert_main(["--to", "transformers", thudm, str(hf)]) == 0
    assert convert_main(["--from", "transformers", str(hf), str(back)]) == 0
    return root / "thudm", hf, back


def test_the_glm4_family_converts_through_its_binding():
    assert FAMILIES["glm4"].binding("convert").TRANSFORMERS_MODEL_TYPES == ("glm",)


def test_to_transformers_loads_in_glm_for_causal_lm_with_our_logits(model, converted):
    from transformers import GlmForCausalLM

    _, hf, _ = converted
    config = json.loads((hf / "config.json").read_text())
    assert config["model_type"] == "glm" and config["architectures"] == ["GlmForCausalLM"]
    assert not (hf / "tokenizer.model").exists()  # as glm-4-9b-chat-hf: a tokenizer.json
    theirs = GlmForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    with torch.no_grad():
        torch.testing.assert_close(theirs(IDS).logits, model(IDS).logits, rtol=1e-5, atol=1e-5)
    generation = json.loads((hf / "generation_config.json").read_text())
    assert generation["eos_token_id"] == list(model.config.eos_token_id)
    assert family_at(hf).name == "glm4"  # the detector takes the converted directory for GLM-4's


def test_to_transformers_writes_a_tokenizer_auto_tokenizer_reads_with_our_ids(tokenizer, converted):
    from transformers import AutoTokenizer

    _, hf, _ = converted
    fast = AutoTokenizer.from_pretrained(hf)
    for text in TEXTS:
        assert fast(text)["input_ids"] == tokenizer(text)["input_ids"], text  # [gMASK]<sop> first, as ours
        ids = tokenizer(text)["input_ids"]
        assert fast.decode(ids, skip_special_tokens=True) == tokenizer.decode(ids, skip_special_tokens=True), text
    assert fast.eos_token_id == fast.pad_token_id == tokenizer.eos_token_id and fast.padding_side == "left"
    assert (fast.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
            == tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False))
    assert load_tokenizer(hf).ranks == tokenizer.ranks  # glm_port reads it back


def test_from_transformers_gives_the_same_weights_byte_for_byte(model, converted):
    from glm_port.models.chatglm2.weights import IGNORED_KEYS

    thudm, hf, back = converted
    assert family_at(back).name == "glm4"
    original = {k: v for k, v in load_file(thudm / "model.safetensors").items() if not k.endswith(IGNORED_KEYS)}
    returned = load_file(back / "model.safetensors")
    assert sorted(returned) == sorted(original)
    for name, tensor in original.items():
        assert returned[name].dtype == tensor.dtype and returned[name].shape == tensor.shape, name
        assert returned[name].view(torch.uint8).equal(tensor.view(torch.uint8)), name
    assert (back / "tokenizer.model").read_bytes() == (thudm / "tokenizer.model").read_bytes()
    loaded = load_pretrained(back)
    assert loaded.config.rope_ratio == model.config.rope_ratio
    assert loaded.config.eos_token_id == model.config.eos_token_id
    with torch.no_grad():
        torch.testing.assert_close(loaded(IDS).logits, model(IDS).logits, rtol=1e-5, atol=1e-5)
    assert load_tokenizer(back).chat_template == load_tokenizer(thudm).chat_template


def test_converting_the_wrong_way_is_one_line(converted, tmp_path, capsys):
    thudm, hf, _ = converted
    assert convert_main(["--to", "transformers", str(hf), str(tmp_path / "a")]) == 2
    assert "already transformers' glm layout" in capsys.readouterr().err
    assert convert_main(["--from", "transformers", str(thudm), str(tmp_path / "b")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "is not transformers' GlmForCausalLM" in err
    assert list(tmp_path.iterdir()) == []
