"""glm-generate --model DIR on a ChatGLM2 directory: the family comes from config.json through the registry."""

import io
import json

import pytest

from glm_port.generation.cli import build_parser, main as generate_main, run
from glm_port.models import family_for


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny, write_thudm):
    model, tok = tiny
    directory = tmp_path_factory.mktemp("chatglm2-tiny")
    write_thudm(model, directory, shards=2)
    tok.save_pretrained(directory)
    return directory


def test_registry_knows_the_family():
    family = family_for("chatglm")
    assert family.name == "chatglm2" and family.load(family.model_class).__name__ == "ChatGLM2ForCausalLM"


def test_glm_generate_continues_prompts_greedily(model_dir, tiny):
    model, tok = tiny
    prompts = ["你好", "Mira is the fisher of the valley."]
    out, err = io.StringIO(), io.StringIO()
    run(build_parser().parse_args(["--model", str(model_dir), "--json", "--max-new-tokens", "5", *prompts]), out, err)
    results = [json.loads(line) for line in out.getvalue().splitlines()]
    assert "tokens/s" in err.getvalue()
    assert [r["prompt"] for r in results] == prompts
    batch = tok(prompts, return_tensors="pt", padding=True)
    expected = model.generate(**batch, max_new_tokens=5, do_sample=False, eos_token_id=2, pad_token_id=0)
    for result, row in zip(results, expected[:, batch["input_ids"].shape[1]:].tolist()):
        new = row[:row.index(2)] if 2 in row else row
        assert result["generated_ids"] == [new]
        assert result["text"] == result["prompt"] + tok.decode(new)


def test_glm_generate_static_cache_gives_the_growing_caches_output(model_dir):
    prompts = ["你好", "Mira is the fisher of the valley."]
    outputs = []
    for flags in ([], ["--static-cache"]):
        out, err = io.StringIO(), io.StringIO()
        run(build_parser().parse_args(["--model", str(model_dir), "--json", "--max-new-tokens", "5", *flags,
                                       *prompts]), out, err)
        outputs.append([json.loads(line)["generated_ids"] for line in out.getvalue().splitlines()])
    assert outputs[1] == outputs[0] and len(outputs[0]) == 2


def test_glm_generate_bad_input_exits_2(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "chatglm", "num_layers": 1}))
    with pytest.raises(SystemExit) as exc:
        generate_main(["--model", str(tmp_path), "hello"])
    assert exc.value.code == 2
    assert "no weights" in capsys.readouterr().err


def test_min_new_tokens_past_seq_length_is_refused_before_generating(model_dir, capsys, monkeypatch):
    """max_new_tokens is cut to what fits seq_length (as THUDM's chat cuts max_length); a min_new_tokens
    that cannot fit is one line, exit 2, and nothing is generated."""
    from glm_port.models.chatglm2.model import ChatGLM2ForCausalLM

    calls = []
    monkeypatch.setattr(ChatGLM2ForCausalLM, "generate", lambda self, *a, **k: calls.append(k))
    with pytest.raises(SystemExit) as exc:
        generate_main(["--model", str(model_dir), "--max-new-tokens", "8", "--batch-size", "1", "short", "你好，晚上好" * 200])
    assert exc.value.code == 2 and calls == []
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("glm-generate: error: ") and "does not fit the model's seq_length (512)" in err, err
    with pytest.raises(SystemExit):
        generate_main(["--model", str(model_dir), "--max-new-tokens", "600", "--min-new-tokens", "600", "hello"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "min_new_tokens 600: a prompt of" in err and "seq_length (512)" in err and calls == [], err


def test_pipeline_parallel_is_refused_before_anything_starts_or_loads(model_dir, capsys, monkeypatch):
    """ChatGLM2 declares no pipeline parallelism (``Family.supports``): --pipeline-parallel-size 2 is one line,
    exit 2, before any process group starts or any weight is read (it used to run the whole model on every
    rank, the flag ignored)."""
    from glm_port.generation.parallel import InferenceParallel
    from glm_port.models.chatglm2 import generation

    calls = []

    def started(*args, **kwargs):
        calls.append("parallel")
        raise RuntimeError("the ranks were set up")

    monkeypatch.setattr(InferenceParallel, "from_environment", classmethod(started))
    monkeypatch.setattr(generation, "load", lambda *a, **k: calls.append("load"))
    with pytest.raises(SystemExit) as exc:
        generate_main(["--model", str(model_dir), "--pipeline-parallel-size", "2", "hello"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and calls == [] and len(err) == 1
    assert err[0] == ("glm-generate: error: --pipeline-parallel-size 2: the chatglm2 family does not support "
                      "pipeline parallelism (layers split into stages)")


def test_glm_generate_repetition_penalty_top_k_and_stop_reach_generate(model_dir, generate_calls):
    calls = generate_calls
    args = ["--model", str(model_dir), "--max-new-tokens", "3", "--do-sample", "--top-k", "5", "--seed", "0",
            "--repetition-penalty", "1.25", "--stop", "x", "--stop", "。", "你好"]
    run(build_parser().parse_args(args), io.StringIO(), io.StringIO())
    assert calls and all(c.get("top_k") == 5 and c.get("repetition_penalty") == 1.25
                         and c.get("stop_strings") == ["x", "。"] and c.get("tokenizer") is not None for c in calls)


def test_glm_generate_stop_cuts_the_continuation_at_it(model_dir):
    import re

    def results(*flags):
        out = io.StringIO()
        run(build_parser().parse_args(["--model", str(model_dir), "--json", "--max-new-tokens", "24",
                                       *flags, "hello world", "你好"]), out, io.StringIO())
        return [json.loads(line) for line in out.getvalue().splitlines()]

    plain = results()
    first = plain[0]["text"][len("hello world"):]
    stop = re.search(r"(?<=.)[A-Za-z]{3,}", first)[0]  # a word of the greedy continuation, past its start
    cut = results("--stop", stop)
    assert cut[0]["text"] == "hello world" + first[:first.index(stop)]
    assert len(cut[0]["generated_ids"][0]) < len(plain[0]["generated_ids"][0])
    second = plain[1]["text"][len("你好"):]  # the other row: cut at the stop only if its text holds it
    assert cut[1]["text"] == "你好" + (second[:second.index(stop)] if stop in second else second)


@pytest.mark.parametrize("flags, message", [
    (["--repetition-penalty", "0"], "--repetition-penalty must be a number > 0"),
    (["--repetition-penalty", "inf"], "--repetition-penalty must be a number > 0"),
    (["--top-k", "-2"], "--top-k must be at least 0"),
    (["--stop", ""], "--stop must be a non-empty text"),
])
def test_glm_generate_bad_sampling_flags_are_one_line_exit_2(model_dir, flags, message, capsys):
    with pytest.raises(SystemExit) as stop:
        generate_main(["--model", str(model_dir), *flags, "你好"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err


def test_glm_generate_help_shows_the_sampling_flags_defaults(capsys):
    with pytest.raises(SystemExit):
        generate_main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--repetition-penalty" in text and "(default: off)" in text
    assert "--stop TEXT" in text and "default: none)" in text and "--top-k" in text
