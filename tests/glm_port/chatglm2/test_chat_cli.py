"""glm-chat's bad input and interrupts (issue 26, item 8): options out of range, text that is not UTF-8, a
chat format the tokenizer does not have, a config this port does not run, and Ctrl-C while a reply streams
(the reply stops, the conversation is as before the turn, the prompt comes back)."""

import builtins
import io
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import transformers

import glm_port.chat as glm_chat

REPO = Path(__file__).resolve().parents[3]
GREEDY = {"max_new_tokens": 12, "do_sample": False}


@pytest.mark.parametrize("argv, message", [
    (["--max-new-tokens", "0"], "--max-new-tokens must be at least 1, got 0"),
    (["--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
    (["--top-p", "0"], "--top-p must be in (0, 1], got 0.0"),
    (["--temperature", "-1"], "--temperature must be a number >= 0 (0: greedy), got -1.0"),
    (["--temperature", "nan"], "--temperature must be a number >= 0"),
    (["--prompt", "caf\udce9"], "--prompt 1: not valid UTF-8 (byte 0xe9 at character 4)"),  # argv's surrogateescape
    (["--system", "\udcff"], "--system: not valid UTF-8 (byte 0xff at character 1)"),
])
def test_bad_options_are_one_line_exit_2_before_loading(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(glm_chat, "load", lambda *a, **k: pytest.fail("loaded before the options were checked"))
    assert glm_chat.main([*argv, "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"glm-chat: error: {message}" or (err.startswith("glm-chat: error: ") and message in err
                                                    and "\n" not in err), err


def test_temperature_0_is_greedy(capsys):
    argv = ["--max-new-tokens", "6", "--no-pack", "--seed", "1", "--prompt", "你好"]
    assert glm_chat.generation_options(glm_chat.build_parser().parse_args(["--temperature", "0"])) == \
        {"max_new_tokens": 512, "do_sample": False}
    assert glm_chat.main([*argv, "--greedy"]) == 0
    greedy = capsys.readouterr().out
    assert glm_chat.main([*argv, "--temperature", "0"]) == 0
    assert capsys.readouterr().out == greedy


def test_a_line_that_is_not_utf8_is_refused_and_the_chat_goes_on():
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONIOENCODING": "utf-8:strict"}  # strict: would raise
    run = subprocess.run([sys.executable, "-m", "glm_port.chat", "--max-new-tokens", "3", "--greedy"],
                         input=b"a \xff b\n" + "你好\n/exit\n".encode(), capture_output=True, env=env, timeout=240)
    out, err = run.stdout.decode(), run.stderr.decode()
    assert run.returncode == 0 and "Traceback" not in err, err
    assert "glm-chat: that line is not valid UTF-8 (byte 0xff at character 3); it was not sent" in out
    assert out.count("ChatGLM：") == 1  # the next line was answered


def test_chatglm3_format_on_a_chatglm2_tokenizer_is_refused(tmp_path, capsys, make_model, write_thudm):
    from glm_port.models.chatglm2.tiny import build_tokenizer

    model_dir = write_thudm(make_model(padded_vocab_size=1024), tmp_path / "glm2", shards=1)
    build_tokenizer(str(model_dir))
    assert glm_chat.main(["--model", str(model_dir), "--chat-format", "chatglm3", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"glm-chat: error: --chat-format chatglm3: {model_dir}'s tokenizer is ChatGLM2's, which "
                          "has no <|system|>/<|user|>") and "\n" not in err, err


def test_another_familys_chat_format_on_a_chatglm2_directory_is_refused(tmp_path, capsys, make_model, write_thudm):
    """``--chat-format glm4`` (GLM-4's conversation binding's) on a ChatGLM2 directory: one line, before loading."""
    from glm_port.models.chatglm2.tiny import build_tokenizer

    model_dir = write_thudm(make_model(padded_vocab_size=1024), tmp_path / "glm2", shards=1)
    build_tokenizer(str(model_dir))
    assert glm_chat.main(["--model", str(model_dir), "--chat-format", "glm4", "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"glm-chat: error: --chat-format glm4: {model_dir} is a chatglm2 model, whose chat formats are "
                   "chatglm2, chatglm3"), err


@pytest.mark.parametrize("field, value", [("pre_seq_len", 128)])
def test_unsupported_config_is_one_line_in_every_loader(tmp_path, capsys, make_model, write_thudm, field, value):
    from glm_port.convert import merge, native
    from glm_port.generation import cli as generate
    from glm_port.models.chatglm2.tiny import build_tokenizer

    model_dir = write_thudm(make_model(padded_vocab_size=1024), tmp_path / "q", shards=1)
    build_tokenizer(str(model_dir))
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, field: value}))
    expected = f"{model_dir / 'config.json'}: ChatGLM2 config sets {field}={value!r}: not supported here (a P-Tuning"
    assert glm_chat.main(["--model", str(model_dir), "--prompt", "hi"]) == 2
    assert native.main(["--to", "transformers", str(model_dir), str(tmp_path / "hf")]) == 2
    for main, argv in ((generate.main, ["--model", str(model_dir), "hi"]),
                       (merge.main, [str(model_dir), str(tmp_path / "m")])):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 4 and all(expected in line for line in lines), lines
    assert not (tmp_path / "hf").exists() and not (tmp_path / "m").exists()


def test_quantization_bit_loads_in_chat_and_generate_and_is_refused_by_the_converters(tmp_path, capsys, make_model,
                                                                                      write_thudm):
    """THUDM's ``quantization_bit`` (issue 31): glm-chat and glm-generate quantize at load; glm-convert and
    glm-merge, which need float weights, refuse it in one line and write nothing."""
    from glm_port.convert import merge, native
    from glm_port.generation import cli as generate
    from glm_port.models.chatglm2.tiny import build_tokenizer

    model_dir = write_thudm(make_model(padded_vocab_size=1024), tmp_path / "q", shards=1)
    build_tokenizer(str(model_dir))
    config = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "quantization_bit": 8}))
    assert glm_chat.main(["--model", str(model_dir), "--greedy", "--max-new-tokens", "2", "--prompt", "hi"]) == 0
    out = io.StringIO()
    generate.run(generate.build_parser().parse_args(["--model", str(model_dir), "--max-new-tokens", "2", "hi"]),
                 out=out, err=io.StringIO())
    assert out.getvalue().strip()
    capsys.readouterr()
    assert native.main(["--to", "transformers", str(model_dir), str(tmp_path / "hf")]) == 2
    with pytest.raises(SystemExit) as stop:
        merge.main([str(model_dir), str(tmp_path / "m")])
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    expected = "ChatGLM2 config sets quantization_bit=8: a quantized checkpoint is read by glm-chat, glm-generate"
    assert len(lines) == 2 and all(expected in line for line in lines), lines
    assert not (tmp_path / "hf").exists() and not (tmp_path / "m").exists()


# ---------------------------------------------------------------- Ctrl-C while a reply streams
class Interrupting(transformers.TextIteratorStreamer):
    """A streamer whose consumer gets a KeyboardInterrupt at its ``at``-th piece, where a real Ctrl-C lands:
    the main thread waiting for the next piece (inside stream_chat's generators).

    Patched in by its dotted name, not on this module's ``transformers``: transformers' ``processing_utils``
    (imported the first time a model turns on activation checkpointing) executes ``transformers/__init__.py`` a
    second time and puts that new module object in ``sys.modules``, so a module imported earlier can hold a
    stale one."""

    at, count = 3, 0

    def __next__(self):
        value = super().__next__()
        Interrupting.count += 1
        if Interrupting.count == Interrupting.at:
            raise KeyboardInterrupt
        return value


class InterruptingOut(io.StringIO):
    """An output whose second write is interrupted: Ctrl-C landing in glm-chat's own code, the stream suspended."""

    def __init__(self):
        super().__init__()
        self.writes = 0

    def write(self, text):
        self.writes += 1
        if self.writes == 2:
            raise KeyboardInterrupt
        return super().write(text)


@pytest.mark.parametrize("where", ["streamer", "output"])
def test_an_interrupted_turn_leaves_history_and_cache_as_before(tiny, monkeypatch, where):
    model, tok = tiny
    reference = glm_chat.Conversation([])
    for query in ("你好", "明天见"):
        reference.turn(model, tok, query, GREEDY, io.StringIO())
    conversation = glm_chat.Conversation([])
    conversation.turn(model, tok, "你好", GREEDY, io.StringIO())
    history, length, threads = list(conversation.history), conversation.past.get_seq_length(), threading.active_count()
    out = io.StringIO()
    if where == "streamer":
        Interrupting.count = 0
        monkeypatch.setattr("transformers.TextIteratorStreamer", Interrupting)
    else:
        out = InterruptingOut()
    with pytest.raises(KeyboardInterrupt):
        conversation.turn(model, tok, "晚上好，今天天气很好", {**GREEDY, "max_new_tokens": 200}, out)
    assert threading.active_count() == threads  # generate's worker stopped and joined
    assert conversation.history == history and conversation.past.get_seq_length() == length
    monkeypatch.undo()
    reply = io.StringIO()
    conversation.turn(model, tok, "明天见", GREEDY, reply)  # as if the interrupted turn never happened
    assert conversation.history == reference.history
    assert conversation.past.get_seq_length() == reference.past.get_seq_length()


def test_ctrl_c_in_a_reply_returns_to_the_prompt(monkeypatch, capsys):
    Interrupting.count = 0
    monkeypatch.setattr("transformers.TextIteratorStreamer", Interrupting)
    lines = iter(["你好", "晚上好", "/exit"])
    monkeypatch.setattr(builtins, "input", lambda prompt="": next(lines))
    assert glm_chat.main(["--greedy", "--max-new-tokens", "8", "--no-pack"]) == 0
    out = capsys.readouterr().out
    assert "(reply stopped; this turn is forgotten)" in out and out.count("ChatGLM：") == 2


def test_ctrl_c_outside_a_reply_exits_130_without_a_traceback(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(glm_chat, "load", interrupted)  # Ctrl-C while the model loads
    assert glm_chat.main(["--prompt", "hi"]) == 130


def test_sigint_while_a_reply_streams_returns_to_the_prompt():
    """A real Ctrl-C (SIGINT) to a glm-chat process while its reply streams: the reply stops, the prompt
    comes back and /exit then ends it with status 0, no traceback."""
    import signal
    import time

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen([sys.executable, "-m", "glm_port.chat", "--greedy", "--max-new-tokens", "400",
                                "--no-pack"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=env)
    seen = bytearray()

    def read():
        while chunk := process.stdout.read1(4096):
            seen.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()

    def wait_for(pattern: bytes, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and process.poll() is None:
            if pattern in seen:
                return True
            time.sleep(0.05)
        return pattern in seen

    try:
        process.stdin.write("你好\n".encode())
        process.stdin.flush()
        reply = "ChatGLM：".encode()
        assert wait_for(reply, 180), seen.decode(errors="replace")
        deadline = time.monotonic() + 60  # a piece of the reply printed: it is streaming
        while len(seen) <= seen.index(reply) + len(reply) and time.monotonic() < deadline:
            time.sleep(0.02)
        process.send_signal(signal.SIGINT)
        assert wait_for(b"(reply stopped; this turn is forgotten)", 60), seen.decode(errors="replace")
        process.stdin.write(b"/exit\n")
        process.stdin.flush()
        process.wait(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    reader.join(timeout=10)
    err = process.stderr.read().decode()
    assert process.returncode == 0 and "Traceback" not in err, err
