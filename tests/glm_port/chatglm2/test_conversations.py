"""glm-finetune's conversation data (issue 30): THUDM ChatGLM2 ptuning's ``history_column`` and ChatGLM3
finetune_demo's ``conversations`` (system/user/assistant/observation, ``tools`` on the system turn). The ids are
the prompt the family's ``chat`` builds for the same history; the loss counts assistant replies only; a
conversation whose roles do not alternate, or with no assistant turn, is one line naming file and line."""

import json
import re

import pytest

from glm_port.finetune.datasets import DataError, Pair, read_pairs
from glm_port.finetune.run import main as finetune_main
from glm_port.models.chatglm2.chat import build_inputs
from glm_port.models.chatglm2.finetune import IGNORE_INDEX, encode, save

LOSS = re.compile(r"^ iteration +(\d+)/ +\d+ \| .* \| lm loss (\S+) \|$", re.MULTILINE)
TOOLS = [{"name": "get_weather", "description": "天气", "parameters": {"type": "object",
                                                                      "properties": {"city": {"type": "string"}}}}]
CONVERSATION = [
    {"role": "system", "content": "你是助手", "tools": TOOLS},
    {"role": "user", "content": "北京天气"},
    {"role": "assistant", "metadata": "get_weather", "content": "tool_call(city='北京')"},
    {"role": "observation", "content": "{\"weather\": \"晴\"}"},
    {"role": "assistant", "content": "北京晴"},
    {"role": "user", "content": "谢谢"},
    {"role": "assistant", "content": "不客气"},
]


@pytest.fixture(scope="module")
def chatglm3():
    from glm_port.models.chatglm2.tiny import build_tiny

    return build_tiny(chat_format="chatglm3")


def _write(path, records):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), encoding="utf-8")
    return path


def _counted(sample):
    """The tokens the loss predicts (each counted position's next token), in order."""
    return sample.target[sample.loss_mask == 1].tolist()


def test_history_column_builds_chatglm2s_round_prompt_and_counts_the_last_response(tiny, tmp_path):
    model, tok = tiny
    data = _write(tmp_path / "h.json", [{"prompt": "还有呢", "response": "蓝色", "history": [["颜色", "红色"], ["再来", "绿色"]]}])
    pair, = read_pairs(data, "plain", "prompt", "response", history_column="history")
    assert pair.history == (("颜色", "红色"), ("再来", "绿色"))
    sample, = encode(tok, [pair], 64, 16)
    chat_prompt = build_inputs(model, tok, "还有呢", [("颜色", "红色"), ("再来", "绿色")])["input_ids"][0].tolist()
    assert "[Round 3]" in tok.build_prompt("还有呢", pair.history)
    assert sample.text[:sample.sep].tolist() == chat_prompt  # exactly what chat feeds the model
    assert sample.text.tolist() == chat_prompt + tok.encode("蓝色", add_special_tokens=False) + [tok.eos_token_id]
    assert _counted(sample) == tok.encode("蓝色", add_special_tokens=False) + [tok.eos_token_id]
    predict, = encode(tok, [pair], 64, 16, with_targets=False)
    assert predict.text.tolist() == chat_prompt and not predict.loss_mask.any()


def test_a_chatglm2_conversation_reads_as_a_history(tiny):
    model, tok = tiny
    turns = [{"role": "user", "content": "颜色"}, {"role": "assistant", "content": "红色"},
             {"role": "user", "content": "还有呢"}, {"role": "assistant", "content": "蓝色"}]
    sample, = encode(tok, [Pair("还有呢", "蓝色", messages=tuple(turns))], 64, 16)
    chat_prompt = build_inputs(model, tok, "还有呢", [("颜色", "红色")])["input_ids"][0].tolist()
    assert sample.text[:sample.sep].tolist() == chat_prompt
    with pytest.raises(ValueError, match=r"c\.json:4: ChatGLM2's prompt has user and assistant turns only.*system"):
        encode(tok, [Pair("q", "a", messages=({"role": "system", "content": "s"}, *turns[:2]), where="c.json:4")],
               64, 16)


def test_conversations_ids_are_chatglm3s_chat_prompt_and_every_assistant_reply_is_counted(chatglm3, tmp_path):
    model, tok = chatglm3
    data = _write(tmp_path / "c.json", [{"conversations": CONVERSATION}])
    pair, = read_pairs(data, "conversations")
    assert (pair.source, pair.target) == ("谢谢", "不客气")
    sample, = encode(tok, [pair], 512, 64)
    # chat's prompt for the last user turn, the conversation before it as history (tools as chat puts them)
    chat_prompt = build_inputs(model, tok, "谢谢", CONVERSATION[:5])["input_ids"][0].tolist()
    assert sample.text[:sample.sep].tolist() == chat_prompt
    text = tok.sp_model.encode
    reply = [*text("\n"), *text("不客气")]
    assert sample.text.tolist() == chat_prompt + reply + [tok.eos_token_id]
    # counted: each assistant turn's "\n"/metadata line and text, and the token after it (next role, </s>)
    command = tok.get_command
    expected = [*text("get_weather\n"), *text("tool_call(city='北京')"), command("<|observation|>"),
                *text("\n"), *text("北京晴"), command("<|user|>"), *reply, tok.eos_token_id]
    assert _counted(sample) == expected
    labels = [IGNORE_INDEX] + [t if m else IGNORE_INDEX for t, m in zip(sample.target[:-1], sample.loss_mask[:-1])]
    ids = sample.text.tolist()
    for k, label in enumerate(labels):  # nothing of the system, user or observation turns is counted
        if label != IGNORE_INDEX:
            role = next(r for p in range(k - 1, -1, -1) for r in ("assistant", "user", "system", "observation")
                        if ids[p] == command(f"<|{r}|>"))
            assert role == "assistant", k
    predict, = encode(tok, [pair], 512, 64, with_targets=False)
    assert predict.text.tolist() == chat_prompt


def test_history_column_on_chatglm3_counts_every_assistant_turn(chatglm3):
    model, tok = chatglm3
    sample, = encode(tok, [Pair("还有呢", "蓝色", history=(("颜色", "红色"),))], 64, 16)
    chat_prompt = build_inputs(model, tok, "还有呢", [("颜色", "红色")])["input_ids"][0].tolist()
    assert sample.text[:sample.sep].tolist() == chat_prompt
    text = tok.sp_model.encode
    assert _counted(sample) == [*text("\n"), *text("红色"), tok.get_command("<|user|>"), *text("\n"), *text("蓝色"),
                                tok.eos_token_id]


BAD = [
    ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}],
     "roles do not alternate: turn 2 is a user turn after a user turn"),
    ([{"role": "assistant", "content": "a"}], "roles do not alternate: turn 1 is a assistant turn as the first turn"),
    ([{"role": "user", "content": "a"}, {"role": "observation", "content": "b"}],
     "turn 2 is a observation turn after a user turn"),
    ([{"role": "system", "content": "s"}, {"role": "user", "content": "a"}], "has no assistant turn"),
    ([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "system", "content": "s"}],
     "turn 3 is a system turn after a assistant turn"),
    ([{"role": "tool", "content": "a"}], "role 'tool'; roles are system, user, assistant, observation"),
    ([{"role": "user", "content": "a", "tools": []}, {"role": "assistant", "content": "b"}],
     "'tools' belong on the system turn"),
    ([{"role": "user"}], "must be an object with a string 'role' and 'content'"),
]


@pytest.mark.parametrize("turns, message", BAD)
def test_bad_conversations_name_the_file_and_line(turns, message, tmp_path):
    good = {"conversations": CONVERSATION}
    data = _write(tmp_path / "c.json", [good, {"conversations": turns}])
    with pytest.raises(DataError) as caught:
        read_pairs(data, "conversations")
    assert str(caught.value).startswith(f"{data}:2: ") and message in str(caught.value), str(caught.value)


def _base(tmp_path, chat_format="chatglm3"):
    from glm_port.models.chatglm2.tiny import build_tiny

    (tmp_path / "tokenizer").mkdir(exist_ok=True)
    save(*build_tiny(str(tmp_path / "tokenizer"), chat_format=chat_format), tmp_path / "base")
    return str(tmp_path / "base")


@pytest.mark.parametrize("chat_format, record, message", [
    ("chatglm3", {"conversations": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
     ":2: roles do not alternate"),
    ("chatglm3", {"conversations": [{"role": "user", "content": "a"}]}, ":2: the conversation has no assistant turn"),
    ("chatglm2", {"conversations": CONVERSATION}, ":2: ChatGLM2's prompt has user and assistant turns only"),
])
def test_glm_finetune_refuses_a_bad_conversation_in_one_line_writing_nothing(chat_format, record, message,
                                                                             tmp_path, capsys):
    base = _base(tmp_path, chat_format)
    data = _write(tmp_path / "t.json", [{"conversations": CONVERSATION[1:3]}, record])
    out = tmp_path / "out"
    capsys.readouterr()  # what saving the base printed
    with pytest.raises(SystemExit) as exit_:
        finetune_main(["--model_name_or_path", base, "--dataset_layout", "conversations", "--do_train",
                       "--train_file", str(data), "--output_dir", str(out)])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]  # not loading's bars
    assert exit_.value.code == 2 and len(errors) == 1 and f"{data}{message}" in errors[0], errors
    assert not out.exists()


def test_glm_has_no_chat_format_for_conversations(tmp_path, capsys):
    data = _write(tmp_path / "t.json", [{"source": "a", "target": "b", "history": [["x", "y"]]}])
    with pytest.raises(SystemExit) as exit_:
        finetune_main(["--do_train", "--train_file", str(data), "--history_column", "history",
                       "--output_dir", str(tmp_path / "out")])
    assert exit_.value.code == 2
    assert "--history_column history: the glm family has no chat format" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_glm_finetune_trains_on_chatglm3_conversations_and_predicts_the_next_reply(tmp_path, capsys):
    base = _base(tmp_path)
    data = _write(tmp_path / "t.json", [{"conversations": CONVERSATION}] * 4)
    test = _write(tmp_path / "p.json", [{"conversations": CONVERSATION[:6]}])
    finetune_main(["--model_name_or_path", base, "--dataset_layout", "conversations", "--do_train", "--do_predict",
                   "--train_file", str(data), "--test_file", str(test), "--max_steps", "4", "--logging_steps", "1",
                   "--learning_rate", "1e-2", "--src_length", "400", "--tgt_length", "40", "--num_beams", "1",
                   "--per_device_train_batch_size", "4", "--output_dir", str(tmp_path / "out")])
    losses = {int(m[1]): float(m[2]) for m in LOSS.finditer(capsys.readouterr().out)}
    assert sorted(losses) == [1, 2, 3, 4] and losses[4] < losses[1]
    predicted, = [json.loads(line) for line in (tmp_path / "out" / "test_predictions.jsonl").read_text().splitlines()]
    assert predicted["source"] == "谢谢" and isinstance(predicted["prediction"], str)


def test_glm_finetune_trains_on_thudms_history_column_layout(tmp_path, capsys):
    """THUDM ChatGLM2 ptuning/main.py's flags as they are (--prompt_column, --response_column, --history_column)
    on a ChatGLM2 base: the samples are encoded through chat's [Round i] prompt and the loss falls."""
    base = _base(tmp_path, "chatglm2")
    rows = [{"prompt": "还有呢", "response": "蓝色", "history": [["颜色", "红色"]]},
            {"prompt": "颜色", "response": "红色", "history": []}] * 4
    data = _write(tmp_path / "t.json", rows)
    capsys.readouterr()
    finetune_main(["--model_name_or_path", base, "--prompt_column", "prompt", "--response_column", "response",
                   "--history_column", "history", "--do_train", "--train_file", str(data), "--max_steps", "4",
                   "--logging_steps", "1", "--learning_rate", "1e-2", "--src_length", "64", "--tgt_length", "16",
                   "--per_device_train_batch_size", "8", "--output_dir", str(tmp_path / "out")])
    losses = {int(m[1]): float(m[2]) for m in LOSS.finditer(capsys.readouterr().out)}
    assert sorted(losses) == [1, 2, 3, 4] and losses[4] < losses[1]


@pytest.mark.parametrize("history, message", [
    ([["颜色"]], ":2: field 'history' must be a list of [query, response] string pairs"),
    ("颜色", ":2: field 'history' must be a list of [query, response] string pairs"),
    ([["颜色", 3]], ":2: field 'history' must be a list of [query, response] string pairs"),
])
def test_a_bad_history_column_is_one_line_naming_file_and_line(history, message, tmp_path, capsys):
    base = _base(tmp_path, "chatglm2")
    data = _write(tmp_path / "t.json", [{"prompt": "a", "response": "b", "history": []},
                                        {"prompt": "a", "response": "b", "history": history}])
    out = tmp_path / "out"
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        finetune_main(["--model_name_or_path", base, "--prompt_column", "prompt", "--response_column", "response",
                       "--history_column", "history", "--do_train", "--train_file", str(data),
                       "--output_dir", str(out)])
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert exit_.value.code == 2 and errors == [f"glm-finetune: error: {data}{message}"], errors
    assert not out.exists()
