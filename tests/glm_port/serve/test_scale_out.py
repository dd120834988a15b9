"""Scale-out (docs/serve.md): glm-convert's transformers-native directory is what vLLM serves. Its model loads in
transformers' AutoModelForCausalLM and its tokenizer in AutoTokenizer, both with no remote code; the tokenizer
(a tokenizer.json converted from tokenizer.model, the specials at THUDM's ids, ``[gMASK] <sop>`` added by its
post-processor, the chat format as a chat template) gives the ids of the project's ChatGLM2/ChatGLM3 tokenizer
for text and for chat prompts."""

import json
import os
import random

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from glm_port.convert import native
from glm_port.models import build_tiny
from glm_port.models.chatglm2.chat import encode_messages
from glm_port.models.chatglm2.weights import load_tokenizer

TEXTS = [
    "hello world", "你好，我是一个语言模型。", "The cat sat on the mat.\nThen it slept.", " leading space",
    "trailing space ", "two  spaces   and three", "\n\nnewlines first\n", "tab\there", "", " ", "  ", "\n",
    "问：中国的首都是哪里？\n\n答：北京。", "digits 12345 and 3.14159", "emoji 😀 and é ü ß", "people develop Aesop sop eop",
    "a </s> b", "<unk> inside", "mixed 中文 and English, 标点！？", "```python\nprint('hi')\n```",
]
CHARS = list("abcdefghijklmnopqrstuvwxyz ABC  \n\t你好世界的是了我，。？！：0123456789éü😀-_'\"") + ["the ", "问：", "答："]


def random_texts(count=300, seed=0):
    rng = random.Random(seed)
    return ["".join(rng.choice(CHARS) for _ in range(rng.randint(1, 40))) for _ in range(count)]


CONVERSATIONS = [
    [{"role": "user", "content": "你好"}],
    [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Hi! How can I help?"},
     {"role": "user", "content": "Tell me a story\nabout a cat."}],
    [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "问：1+1=?"},
     {"role": "assistant", "content": "2"}, {"role": "user", "content": " spaces  around "}],
    [{"role": "user", "content": "first"}, {"role": "assistant", "content": ""}, {"role": "user", "content": "二"}],
]
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "天气 of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
CHATGLM3_ONLY = [
    [{"role": "user", "content": "weather in Paris?"}, {"role": "assistant", "content": "let me check"},
     {"role": "tool", "content": "{\"temperature\": 21}"}],
]


@pytest.fixture(scope="module", params=["chatglm2", "chatglm3"])
def converted(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(f"scale-out-{request.param}")
    model, tokenizer = build_tiny(chat_format=request.param)
    source = root / "thudm"
    model.save_pretrained(source)
    tokenizer.save_pretrained(source)
    assert native.main(["--to", "transformers", str(source), str(root / "hf")]) in (None, 0)
    return model, tokenizer, root


def test_the_model_loads_in_transformers_without_remote_code(converted):
    model, tokenizer, root = converted
    native_model = AutoModelForCausalLM.from_pretrained(root / "hf", trust_remote_code=False).eval()
    assert type(native_model).__name__ == "GlmForCausalLM"
    ids = torch.tensor([tokenizer("the cat sat")["input_ids"]])
    with torch.inference_mode():
        torch.testing.assert_close(native_model(ids).logits, model(ids).logits, rtol=1e-4, atol=1e-4)
    stops = native_model.generation_config.eos_token_id  # where a chat reply ends, as glm-serve's reply_stop_ids
    if tokenizer.is_chatglm3:
        assert stops == [2, tokenizer.get_command("<|user|>"), tokenizer.get_command("<|observation|>")]
    else:
        assert stops in (2, [2])


def test_the_tokenizer_files_are_transformers_own(converted):
    _, tokenizer, root = converted
    files = {p.name for p in (root / "hf").iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json", "tokenizer.model"} <= files
    assert "chat_template.jinja" not in files
    config = json.loads((root / "hf" / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast" and "auto_map" not in config
    assert "[gMASK]<sop>" in config["chat_template"] and config["padding_side"] == "left"
    assert config["chat_format"] == tokenizer.chat_format


def test_the_tokenizer_loads_in_transformers_as_chatglm2s(converted):
    _, tokenizer, root = converted
    native_tokenizer = AutoTokenizer.from_pretrained(root / "hf", trust_remote_code=False)
    assert type(native_tokenizer).__name__ in ("PreTrainedTokenizerFast", "TokenizersBackend")
    n = tokenizer.sp_model.vocab_size()
    names = {"sop": "<sop>", "eop": "<eop>"}
    for i, token in enumerate(tokenizer.command_tokens):  # THUDM's ids: right after the sentencepiece pieces
        assert native_tokenizer.convert_tokens_to_ids(names.get(token, token)) == n + i == tokenizer.get_command(token)
    assert native_tokenizer.eos_token_id == tokenizer.eos_token_id == 2
    assert native_tokenizer.pad_token_id == tokenizer.pad_token_id == 0
    assert len(native_tokenizer) == tokenizer.vocab_size
    for text in TEXTS + random_texts():
        ours = tokenizer(text)["input_ids"]
        assert ours[:2] == [tokenizer.get_command("[gMASK]"), tokenizer.get_command("sop")]
        assert native_tokenizer(text)["input_ids"] == ours, repr(text)
        assert native_tokenizer(text, add_special_tokens=False)["input_ids"] == ours[2:], repr(text)
        assert native_tokenizer.decode(ours[2:], skip_special_tokens=True) == tokenizer.decode(ours[2:]), repr(text)
    pair = tokenizer("question", "answer")["input_ids"]
    assert native_tokenizer("question", "answer")["input_ids"] == pair and pair[-1] == tokenizer.eos_token_id
    batch = native_tokenizer(["hello world", "hi"], padding=True)  # left padding with pad 0, as ours
    assert batch["input_ids"] == tokenizer(["hello world", "hi"], padding=True)["input_ids"]
    assert batch["attention_mask"] == tokenizer(["hello world", "hi"], padding=True)["attention_mask"]


def test_the_chat_template_gives_our_chat_ids(converted):
    _, tokenizer, root = converted
    native_tokenizer = AutoTokenizer.from_pretrained(root / "hf", trust_remote_code=False)
    conversations = CONVERSATIONS + (CHATGLM3_ONLY if tokenizer.is_chatglm3 else [])
    for messages in conversations:
        ours = encode_messages(tokenizer, messages)
        theirs = native_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
        assert theirs == ours, messages
    if tokenizer.is_chatglm3:
        for messages in (CONVERSATIONS[0], CONVERSATIONS[2]):  # tools in the system message, as glm-serve puts them
            theirs = native_tokenizer.apply_chat_template(messages, tools=TOOLS, add_generation_prompt=True,
                                                          tokenize=True)["input_ids"]
            assert theirs == encode_messages(tokenizer, messages, tools=TOOLS), messages
        history = [{"role": "system", "content": "sys", "tools": [TOOLS[0]["function"]]},  # THUDM's message dicts
                   {"role": "assistant", "metadata": "get_weather", "content": "tool_call(city='Paris')"}]
        theirs = native_tokenizer.apply_chat_template(history + [{"role": "observation", "content": "21"}],
                                                      add_generation_prompt=True, tokenize=True)["input_ids"]
        assert theirs == tokenizer.build_chat_input("21", history, role="observation")["input_ids"][0].tolist()


def test_the_round_trip_keeps_the_chatglm_tokenizer(converted):
    _, tokenizer, root = converted
    back = root / "back"
    assert native.main(["--from", "transformers", str(root / "hf"), str(back)]) in (None, 0)
    config = json.loads((back / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert config["tokenizer_class"] != "PreTrainedTokenizerFast" and not (back / "tokenizer.json").exists()
    again = load_tokenizer(back)
    assert again.chat_format == tokenizer.chat_format
    assert (back / "tokenizer.model").read_bytes() == (root / "thudm" / "tokenizer.model").read_bytes()
    for text in TEXTS:
        assert again(text)["input_ids"] == tokenizer(text)["input_ids"]


@pytest.mark.skipif(not os.environ.get("CHATGLM2_TOKENIZER"),
                    reason="set CHATGLM2_TOKENIZER=/path/to/chatglm2-6b/tokenizer.model to check the real vocabulary")
@pytest.mark.parametrize("chat_format", ["chatglm2", "chatglm3"])
def test_the_fast_tokenizer_gives_our_ids_on_the_real_vocabulary(tmp_path, chat_format):
    from glm_port.models.chatglm2.tokenizer import ChatGLM2Tokenizer, save_fast_tokenizer

    tokenizer = ChatGLM2Tokenizer(os.environ["CHATGLM2_TOKENIZER"], chat_format=chat_format)
    save_fast_tokenizer(tokenizer, tmp_path)
    native_tokenizer = AutoTokenizer.from_pretrained(tmp_path, trust_remote_code=False)
    n = tokenizer.sp_model.vocab_size()  # 64789 on the real vocabulary: [gMASK] 64790, sop 64792 (THUDM's)
    assert [native_tokenizer.convert_tokens_to_ids(t) for t in ("[gMASK]", "<sop>")] == [n + 1, n + 3]
    for text in TEXTS + random_texts(1000):
        assert native_tokenizer(text)["input_ids"] == tokenizer(text)["input_ids"], repr(text)
    for messages in CONVERSATIONS:
        theirs = native_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)["input_ids"]
        assert theirs == encode_messages(tokenizer, messages), messages
