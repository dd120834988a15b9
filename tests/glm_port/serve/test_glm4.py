"""glm-serve on GLM-4: ``--chat-format`` takes its choices from the families' bindings, so the embedded tiny GLM-4
(``--chat-format glm4``, no ``--model``) and a GLM-4 directory are served; a chat completion through the app (in
process, starlette's TestClient) returns a reply to a prompt in GLM-4's format."""

from __future__ import annotations

import pytest
import torch
from starlette.testclient import TestClient

from glm_port.serve.cli import build, build_parser
from glm_port.serve.cli import main as serve_main

torch.set_num_threads(1)
HELLO = [{"role": "user", "content": "你好"}]


def chat_once(argv):
    app, engine = build(build_parser().parse_args([*argv, "--no-pack"]))
    try:
        with TestClient(app) as client:
            response = client.post("/v1/chat/completions", json={
                "model": engine.served.name, "messages": HELLO, "max_tokens": 4, "temperature": 0})
    finally:
        engine.close()
    assert response.status_code == 200, response.text
    return engine.served, response.json()


def check_glm4_reply(served, body):
    ids = served.encode_chat(HELLO)
    assert served.family.name == "glm4" and served.chat_format == "glm4"
    assert served.tokenizer.decode(ids) == "[gMASK]<sop><|user|>\n你好<|assistant|>"  # GLM-4's prompt
    assert body["usage"]["prompt_tokens"] == len(ids)
    message = body["choices"][0]["message"]
    assert message["role"] == "assistant" and isinstance(message["content"], str)
    assert 1 <= body["usage"]["completion_tokens"] <= 4


def test_the_chat_format_choices_are_the_families():
    choices = next(a for a in build_parser()._actions if a.dest == "chat_format").choices
    assert set(choices) == {"chatglm2", "chatglm3", "glm4"}


def test_the_embedded_tiny_glm4_chats():
    served, body = chat_once(["--chat-format", "glm4"])
    assert served.name == "glm4-tiny"
    check_glm4_reply(served, body)


def test_a_glm4_directory_chats(tmp_path):
    from glm_port.models import build_tiny
    from glm_port.models.glm4.tiny import write_directory

    model, tokenizer = build_tiny("glm4")
    directory = write_directory(model, tokenizer, tmp_path / "glm4", "thudm")
    served, body = chat_once(["--model", directory, "--chat-format", "glm4"])
    check_glm4_reply(served, body)


def test_another_familys_chat_format_is_one_line(tmp_path, capsys):
    from glm_port.models import build_tiny
    from glm_port.models.glm4.tiny import write_directory

    model, tokenizer = build_tiny("glm4")
    directory = write_directory(model, tokenizer, tmp_path / "glm4", "thudm")
    assert serve_main(["--model", directory, "--chat-format", "chatglm3"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"glm-serve: error: --chat-format chatglm3: {directory} is a glm4 model, whose chat "
                           f"formats are glm4")


@pytest.mark.parametrize("chat_format", ["chatglm2", "chatglm3"])
def test_the_embedded_model_keeps_chatglm_formats(chat_format):
    from glm_port.serve.engine import ServedModel

    served = ServedModel.load(chat_format=chat_format)
    assert served.family.name == "chatglm2" and served.chat_format == chat_format
