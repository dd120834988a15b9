"""chat / stream_chat as THUDM's model offers them, transformers' pipeline, and the glm-chat command
(on the embedded tiny model, and its one-line errors)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import pipeline

from glm_port.chat import main as chat_main
from glm_port.models.chatglm2.chat import PromptTooLong

REPO = Path(__file__).resolve().parents[3]


def test_chat_is_generate_on_the_prompt(tiny):
    model, tok = tiny
    history = [("你好", "你好！")]
    response, new_history = model.chat(tok, "晚上好", history, do_sample=False, max_new_tokens=6)
    ids = tok(tok.build_prompt("晚上好", history), return_tensors="pt")["input_ids"]
    expected = model.generate(ids, do_sample=False, max_new_tokens=6, eos_token_id=2, pad_token_id=0)
    assert response == tok.decode(expected[0, ids.shape[1]:].tolist()).strip()
    assert new_history == history + [("晚上好", response)]


def test_stream_chat_ends_with_chats_answer(tiny):
    model, tok = tiny
    torch.manual_seed(7)
    response, _ = model.chat(tok, "你好", max_new_tokens=8)  # THUDM's defaults: sampling, top-p 0.8, T 0.8
    torch.manual_seed(7)
    steps = list(model.stream_chat(tok, "你好", max_new_tokens=8))
    assert steps[-1][0] == response and steps[-1][1] == [("你好", response)]
    assert len(steps) > 1 and all(steps[-1][0].startswith(s[0]) for s in steps)


def test_pipeline_text_generation(tiny):
    model, tok = tiny
    prompt = tok.build_prompt("你好")
    out = pipeline("text-generation", model=model, tokenizer=tok)(prompt, max_new_tokens=5, do_sample=False)
    ids = tok(prompt, return_tensors="pt")["input_ids"]
    expected = model.generate(ids, max_new_tokens=5, do_sample=False, eos_token_id=2, pad_token_id=0)
    assert out[0]["generated_text"] == prompt + tok.decode(expected[0, ids.shape[1]:].tolist())


def test_prompt_longer_than_seq_length(tiny):
    model, tok = tiny
    with pytest.raises(PromptTooLong, match=r"prompt of \d+ tokens does not fit the model's seq_length \(512\)"):
        model.chat(tok, "你好" * 600)


def test_glm_chat_interactive_on_the_embedded_model():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [sys.executable, "-m", "glm_port.chat", "--max-new-tokens", "4", "--seed", "0"],
        input="你好\n/clear\n晚上好\n/exit\n", capture_output=True, text=True, env=env, timeout=240,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.count("ChatGLM：") == 2 and "(conversation cleared)" in run.stdout


def test_glm_chat_errors_exit_2(tmp_path, capsys, make_model, write_thudm):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    model_dir = write_thudm(make_model(padded_vocab_size=1024), tmp_path / "glm2", shards=2)
    from glm_port.models.chatglm2.tiny import build_tokenizer

    build_tokenizer(str(model_dir))
    assert chat_main(["--model", str(tmp_path / "other")]) == 2
    assert "model_type 'bert' is not a ChatGLM2-family model" in capsys.readouterr().err
    assert chat_main(["--model", str(model_dir), "--prompt", "你好，晚上好" * 40]) == 2  # seq_length 64
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after transformers' loading progress bar
    assert err.startswith("glm-chat: error: prompt of ") and err.endswith("does not fit the model's seq_length (64)")
    os.remove(model_dir / "pytorch_model-00001-of-00002.bin")
    assert chat_main(["--model", str(model_dir)]) == 2
    assert "pytorch_model-00001-of-00002.bin: shard listed in pytorch_model.bin.index.json is missing" in (
        capsys.readouterr().err)


# ---- replies end at the stop token (issue 26): a scripted logits processor forces it at a known step -------


class Scripted:
    """Sets every next token by the last one (``table``; any other last token: ``default``), the rest -1e4."""

    def __init__(self, table: dict, default: int):
        self.table, self.default = table, default

    def __call__(self, input_ids, scores):
        out = torch.full_like(scores, -1e4)
        for row, last in enumerate(input_ids[:, -1].tolist()):
            out[row, self.table.get(last, self.default)] = 0.0
        return out


def _script(tok, stop):
    """prompt -> A -> B -> stop -> C -> C...: the reply is A B and nothing after."""
    from transformers import LogitsProcessorList

    a, b, c = tok.encode("你好 世界", add_special_tokens=False)[:3]
    return LogitsProcessorList([Scripted({a: b, b: stop, stop: c, c: c}, a)]), tok.decode([a, b]).strip()


@pytest.mark.parametrize("format_, stop", [("chatglm2", "</s>"), ("chatglm3", "</s>"), ("chatglm3", "<|user|>"),
                                           ("chatglm3", "<|observation|>")])
def test_replies_end_at_the_stop_token(format_, stop, tiny):
    """chat, stream_chat and glm-finetune's evaluation cut the reply where eos (ChatGLM3: or a role token it
    stops at) is generated: what follows it, and the stop token itself, are not in the reply."""
    from glm_port.finetune.datasets import Pair
    from glm_port.models.chatglm2 import finetune
    from glm_port.models.chatglm2.tiny import build_tiny

    model, tok = tiny if format_ == "chatglm2" else build_tiny(chat_format=format_)
    stop_id = tok.eos_token_id if stop == "</s>" else tok.get_command(stop)
    script, expected = _script(tok, stop_id)
    response, _ = model.chat(tok, "晚上好", do_sample=False, max_new_tokens=8, logits_processor=script)
    assert response == expected
    *_, (streamed, _) = model.stream_chat(tok, "晚上好", do_sample=False, max_new_tokens=8, logits_processor=script)
    assert streamed == expected
    samples = finetune.encode(tok, [Pair("晚上好", ""), Pair("你好", "")], 32, 8, with_targets=False)
    search = dict(max_new_tokens=8, num_beams=1, do_sample=False, logits_processor=script)
    assert finetune.generate(model, tok, samples, search, 2, "cpu") == [expected, expected]


def test_glm_chat_sampling_flags_reach_generate(generate_calls, capsys):
    """glm-chat's --top-p and --temperature arrive in generate's arguments; --greedy turns sampling off."""
    calls = generate_calls
    assert chat_main(["--max-new-tokens", "2", "--top-p", "0.37", "--temperature", "0.55", "--seed", "0",
                      "--device", "cpu", "--prompt", "你好"]) in (0, None)
    assert calls and all(c.get("top_p") == 0.37 and c.get("temperature") == 0.55 and c.get("do_sample", True)
                         and c.get("max_new_tokens") == 2 for c in calls), calls
    calls.clear()
    chat_main(["--max-new-tokens", "2", "--greedy", "--device", "cpu", "--prompt", "你好"])
    assert calls and all(c.get("do_sample") is False for c in calls), calls


def test_glm_chat_top_k_repetition_penalty_and_stop_reach_generate(generate_calls):
    calls = generate_calls
    assert chat_main(["--max-new-tokens", "2", "--top-k", "7", "--repetition-penalty", "1.3", "--stop", "STOP",
                      "--stop", "。", "--seed", "0", "--device", "cpu", "--prompt", "你好"]) in (0, None)
    assert calls and all(c.get("top_k") == 7 and c.get("repetition_penalty") == 1.3
                         and c.get("stop_strings") == ["STOP", "。"] and c.get("tokenizer") is not None
                         for c in calls), calls


def _reply(capsys, *flags):
    capsys.readouterr()
    assert chat_main(["--max-new-tokens", "24", "--greedy", "--device", "cpu", "--prompt", "hello world",
                      *flags]) in (0, None)
    return capsys.readouterr().out.split("ChatGLM：", 1)[1].rstrip("\n")


def test_glm_chat_stop_cuts_the_reply_at_it(capsys):
    import re

    reply = _reply(capsys)
    stop = re.search(r"(?<=.)[A-Za-z]{3,}", reply)[0]  # a word of the tiny model's greedy reply, past its start
    assert _reply(capsys, "--stop", stop) == reply[:reply.index(stop)]
    assert _reply(capsys, "--stop", "never in it", "--stop", stop) == reply[:reply.index(stop)]


@pytest.mark.parametrize("flags, message", [
    (["--top-k", "-1"], "--top-k must be at least 0"),
    (["--repetition-penalty", "0"], "--repetition-penalty must be a number > 0"),
    (["--repetition-penalty", "nan"], "--repetition-penalty must be a number > 0"),
    (["--stop", ""], "--stop must be a non-empty text"),
])
def test_glm_chat_bad_sampling_flags_are_one_line_exit_2(flags, message, capsys):
    assert chat_main([*flags, "--prompt", "你好"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_glm_chat_help_shows_the_sampling_flags_defaults(capsys):
    with pytest.raises(SystemExit):
        chat_main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--top-k" in text and "(default: transformers' 50)" in text
    assert "--repetition-penalty" in text and "(default 1.0)" in text
    assert "--stop TEXT" in text and "(repeatable; default: none" in text


@pytest.mark.parametrize("chat_format", ["chatglm2", "chatglm3"])
def test_glm_chat_history_keeps_the_reply_cut_at_the_stop(chat_format, capsys, generate_calls):
    """With --no-cache-reuse the next turn re-encodes the history: it holds the reply up to the stop string."""
    import re

    reply = _reply(capsys, "--chat-format", chat_format)
    stop = re.search(r"(?<=.)[A-Za-z]{3,}", reply)[0]
    calls = generate_calls
    calls.clear()  # only the run below
    assert chat_main(["--max-new-tokens", "24", "--greedy", "--device", "cpu", "--chat-format", chat_format,
                      "--no-cache-reuse", "--stop", stop, "--prompt", "hello world", "--prompt", "again"]) in (0, None)
    from glm_port.models.chatglm2.tiny import build_tokenizer

    second = build_tokenizer(chat_format=chat_format).decode(calls[1]["input_ids"][0], skip_special_tokens=True)
    assert reply[:reply.index(stop)].strip() in second and stop not in second, second
