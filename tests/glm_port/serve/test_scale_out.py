"""Scale-out (docs/serve.md): glm-convert's transformers-native directory is what vLLM would serve. Its model
loads in transformers' AutoModelForCausalLM with no remote code; its tokenizer loads in AutoTokenizer with no
remote code too, but not as ChatGLM2's: the five specials and the ``[gMASK] sop`` prefix are missing, so the
ids differ. That gap (issue 32's scale-out item) is held here as a strict xfail: it turns into a failure the
day glm-convert writes a tokenizer transformers reads right, so the docs get updated."""

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from glm_port.convert import native
from glm_port.models import build_tiny


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("scale-out")
    model, tokenizer = build_tiny()
    source = root / "thudm"
    model.save_pretrained(source)
    tokenizer.save_pretrained(source)
    assert native.main(["--to", "transformers", str(source), str(root / "hf")]) in (None, 0)
    return model, tokenizer, root / "hf"


def test_the_model_loads_in_transformers_without_remote_code(converted):
    model, tokenizer, path = converted
    native_model = AutoModelForCausalLM.from_pretrained(path, trust_remote_code=False).eval()
    assert type(native_model).__name__ == "GlmForCausalLM"
    ids = torch.tensor([tokenizer("the cat sat")["input_ids"]])
    with torch.inference_mode():
        torch.testing.assert_close(native_model(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.xfail(strict=True, reason="glm-convert's tokenizer loads in AutoTokenizer (no remote code) as a plain "
                                       "sentencepiece tokenizer: no [gMASK]/sop specials, different ids")
def test_the_tokenizer_loads_in_transformers_as_chatglm2s(converted):
    _, tokenizer, path = converted
    native_tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    for text in ("hello world", "你好，我是一个语言模型。"):
        assert native_tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"]
