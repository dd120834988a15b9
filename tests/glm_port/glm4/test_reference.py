"""GLM-4's tokenizer against THUDM's own ``ChatGLM4Tokenizer`` on the tiny rank file, when a copy of its code is
given (opt-in; THUDM's code never ships with this project).

    GLM4_CODE=/dir/with/tokenization_chatglm.py  GLM4_PYTHON=/python/with/transformers-4.x  pytest ...

``GLM4_CODE`` holds glm-4-9b-chat's ``tokenization_chatglm.py`` (either published version: the first one's
``build_chat_input`` is compared when present) and, optionally, its ``tokenizer_config.json``, whose
``chat_template`` then replaces ours in the directory THUDM's tokenizer reads, so that our template is held
to THUDM's. ``GLM4_PYTHON`` (or ``GLM_REF_PYTHON``) is a Python with transformers 4.x and tiktoken, which that
code needs (4.44 for the published versions: transformers 4.40's ``tojson`` sorts keys and escapes non-ASCII, so
THUDM's template renders tools differently there); the comparison runs there in a subprocess
(glm4_reference_probe.py). ``GLM4_TOKENIZER`` (glm-4-9b-chat's ``tokenizer.model``) repeats it on the real
vocabulary. Compared: the specials, eos/pad, encode with and without ``[gMASK]<sop>``, decode, a left-padded
batch, ``build_single_message``, ``build_chat_input`` (first version) and ``apply_chat_template`` text and ids.
"""

import json
import os
import runpy
import subprocess
from pathlib import Path

import pytest

from glm_port.models.glm4.tokenizer import SPECIAL_TOKENS

CASES = runpy.run_path(str(Path(__file__).with_name("cases.py")))
CONVERSATIONS, TEXTS, as_chat_input = CASES["CONVERSATIONS"], CASES["TEXTS"], CASES["as_chat_input"]
CODE = os.environ.get("GLM4_CODE")
PYTHON = os.environ.get("GLM4_PYTHON") or os.environ.get("GLM_REF_PYTHON")
REAL = os.environ.get("GLM4_TOKENIZER")  # glm-4-9b-chat's tokenizer.model, when at hand
PROBE = Path(__file__).with_name("glm4_reference_probe.py")
# build_single_message's (role, metadata, content): every message of the conversations, and a special and a
# newline written in metadata and content (text there, never a special)
SINGLE_MESSAGES = [(m["role"], m.get("metadata", ""), m["content"]) for c in CONVERSATIONS.values() for m in c] + [
    ("assistant", "get_weather", '{"city": "<|user|>"}'), ("observation", "", "line\n[gMASK]<sop>\n"),
    ("user", "a <|assistant|> b", "")]

pytestmark = pytest.mark.skipif(
    not (CODE and Path(CODE, "tokenization_chatglm.py").is_file() and PYTHON and Path(PYTHON).is_file()),
    reason="THUDM's GLM-4 tokenizer code not given (set GLM4_CODE to the directory of a copy of glm-4-9b-chat's "
           "tokenization_chatglm.py [and tokenizer_config.json] and GLM4_PYTHON, or GLM_REF_PYTHON, to a Python "
           "with transformers 4.x and tiktoken, which that code needs)")


def _thudm(tmp_path, tok):
    directory = tmp_path / "tokenizer"
    tok.save_pretrained(directory)
    theirs = Path(CODE, "tokenizer_config.json")
    if theirs.is_file():
        config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
        config["chat_template"] = json.loads(theirs.read_text(encoding="utf-8"))["chat_template"]
        (directory / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    chat = [dict(zip(("query", "history", "role"), as_chat_input(m), strict=True)) for m in CONVERSATIONS.values()]
    cases = {"specials": list(SPECIAL_TOKENS), "texts": TEXTS, "chat": chat, "messages": list(CONVERSATIONS.values()),
             "single": SINGLE_MESSAGES}
    (tmp_path / "cases.json").write_text(json.dumps(cases, ensure_ascii=False), encoding="utf-8")
    run = subprocess.run([PYTHON, str(PROBE), CODE, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads((tmp_path / "reference.json").read_text(encoding="utf-8")), theirs.is_file()


def test_ids_match_thudms_code(tmp_path, tok):
    _compare(tmp_path, tok)


@pytest.mark.skipif(not REAL, reason="set GLM4_TOKENIZER to glm-4-9b-chat's tokenizer.model to compare on the real "
                                     "vocabulary too")
def test_ids_match_thudms_code_on_the_real_vocabulary(tmp_path):
    from glm_port.models.glm4 import GLM4Tokenizer

    _compare(tmp_path, GLM4Tokenizer(REAL))


def _compare(tmp_path, tok):
    reference, their_template = _thudm(tmp_path, tok)
    assert [tok.get_command(t) for t in SPECIAL_TOKENS] == reference["specials"]
    assert tok.eos_token_id == reference["eos"] and tok.pad_token_id == reference["pad"]
    assert reference["vocab_size"] in (tok.vocab_size, len(tok))  # the first version counted the specials in
    for text, theirs in zip(TEXTS, reference["text"], strict=True):
        assert tok(text)["input_ids"] == theirs["with_prefix"], text
        assert tok.encode(text, add_special_tokens=False) == theirs["plain"], text
        assert tok.decode(theirs["plain"], skip_special_tokens=True) == theirs["decoded"], text
    assert [tok.build_single_message(*case) for case in SINGLE_MESSAGES] == reference["single"]
    ours = tok(TEXTS[:3], padding=True)
    assert ours["input_ids"] == reference["batch"]["input_ids"]
    assert ours["attention_mask"] == reference["batch"]["attention_mask"]
    compared = 0
    for (name, messages), built, templated in zip(CONVERSATIONS.items(), reference["chat"], reference["template"],
                                                  strict=True):
        if built is not None:
            query, history, role = as_chat_input(messages)
            assert tok.build_chat_input(query, history, role=role)["input_ids"][0].tolist() == built, name
            compared += 1
        if templated is not None:
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
            if their_template:
                assert text == templated["text"], name
            assert ids == templated["input_ids"], name
            compared += 1
    assert compared >= len(CONVERSATIONS)
