"""glm-generate: text and JSON output, prompts from a file / stdin / JSON lines, a glm-pretrain --save
directory, and bad input as one line with exit status 2."""

import io
import json
import subprocess
import sys

import pytest
import torch

from glm_port import GLMConfig, GLMModel
from glm_port.checkpoint_io import save_checkpoint
from glm_port.data.tokenization import tiny_wordpiece
from glm_port.generation import cli
from glm_port.models.glm.blanks import fill_blanks
from glm_port.models.glm.hf import GLMForConditionalGeneration
from glm_port.models.glm.tokenizer import GLMTokenizer


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """What ``glm-pretrain --save`` writes, for a tiny GLM on the built-in tokenizer."""
    path = tmp_path_factory.mktemp("ckpt")
    vocab = tiny_wordpiece()
    config = GLMConfig(vocab_size=vocab.vocab_size, num_layers=2, hidden_size=64, num_attention_heads=4,
                       max_sequence_length=32, init_method_std=0.3)
    torch.manual_seed(0)
    save_checkpoint(path, 7, GLMModel(config).state_dict(), config=config)
    return path


def run(argv, stdin=""):
    out, err = io.StringIO(), io.StringIO()
    args = cli.build_parser().parse_args(argv)
    old = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        cli.run(args, out=out, err=err)
    finally:
        sys.stdin = old
    return out.getvalue(), err.getvalue()


def test_json_output_is_fill_blanks(checkpoint):
    prompts = ["the cat sat on the [MASK] .", "one [MASK] two [MASK] three", "language models"]
    out, err = run(["--model", str(checkpoint), "--json", "--max-new-tokens", "5", *prompts])
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["prompt"] for r in records] == prompts
    model = GLMForConditionalGeneration.from_pretrained(checkpoint)
    expected = fill_blanks(model, GLMTokenizer(tiny_wordpiece()), prompts, max_new_tokens=5)
    assert [r["generated_ids"] for r in records] == [f.spans for f in expected]
    assert [r["text"] for r in records] == [f.text for f in expected]
    assert len(records[1]["generated_ids"]) == 2
    assert "tokens/s" in err and "time to first token" in err


def test_text_output_and_prompt_sources(checkpoint, tmp_path):
    file = tmp_path / "prompts.jsonl"
    file.write_text('{"prompt": "a [MASK] b"}\n\nplain text line\n')
    out, _ = run(["--model", str(checkpoint), "--input", str(file), "--max-new-tokens", "3"])
    blocks = out.strip().split("\n\n")
    assert len(blocks) == 2
    marked, text = blocks[0].split("\n")
    assert marked.startswith("[CLS] a [MASK] b") and "<|startofpiece|>" in marked
    stdin_out, _ = run(["--model", str(checkpoint), "--max-new-tokens", "3"], stdin="a [MASK] b\n")
    assert stdin_out.split("\n\n")[0] == blocks[0]


def test_beams_and_return_sequences(checkpoint):
    out, _ = run(["--model", str(checkpoint), "--json", "--max-new-tokens", "4", "--num-beams", "3",
                  "--num-return-sequences", "2", "x [MASK] y"])
    records = [json.loads(line) for line in out.splitlines()]
    assert [r["sequence"] for r in records] == [0, 1]


@pytest.mark.parametrize("argv,message", [
    (["--model", "{tmp}/none", "a"], "no such file or directory"),
    (["--model", "{tmp}", "a"], "holds no GLM weights"),
    (["--model", "{ckpt}", " ".join(["word"] * 40)], "longer than the model's 32 positions"),
    (["--model", "{ckpt}", "--input", "{tmp}/bad.jsonl"], "bad.jsonl line 1: not valid JSON"),
    (["--model", "{ckpt}", "--num-return-sequences", "2", "a"], "needs --num-beams"),
    (["--model", "{ckpt}", "--max-new-tokens", "0", "a"], "--max-new-tokens must be at least 1"),
])
def test_bad_input_is_one_line_exit_2(checkpoint, tmp_path, capsys, argv, message):
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    argv = [a.format(tmp=tmp_path, ckpt=checkpoint) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("glm-generate: error:") and message in err and "\n" not in err


def test_module_entry_point_runs(checkpoint):
    done = subprocess.run([sys.executable, "-m", "glm_port.generate", "--model", str(checkpoint),
                           "--max-new-tokens", "2", "a [MASK]"], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "<|startofpiece|>" in done.stdout


# ---- issue 26: input checked before anything is loaded or generated ------------------------------------


@pytest.mark.parametrize("argv,message", [
    (["a \udcff [MASK]"], "argument 1: not valid UTF-8 (byte 0xff at character 3)"),  # argv's surrogateescape
    (["--input", "{tmp}/latin1.txt"], "latin1.txt line 2: not valid UTF-8 (byte 0xe9 at character 4)"),
    (["--do-sample", "--top-p", "1.5", "a"], "--top-p must be in (0, 1], got 1.5"),
    (["--do-sample", "--top-p", "0", "a"], "--top-p must be in (0, 1], got 0.0"),
    (["--do-sample", "--top-k", "-1", "a"], "--top-k must be at least 0"),
    (["--do-sample", "--temperature", "-0.5", "a"], "--temperature must be a number >= 0"),
    (["--do-sample", "--temperature", "nan", "a"], "--temperature must be a number >= 0"),
    (["--num-beams", "0", "a"], "--num-beams must be at least 1, got 0"),
    (["--min-new-tokens", "5", "--max-new-tokens", "3", "a"], "--min-new-tokens must be between 0 and --max-new-tokens (3)"),
    (["--no-repeat-ngram-size", "-2", "a"], "--no-repeat-ngram-size must be at least 0"),
    # the checkpoint has 32 positions: a blank's tokens take block positions 1..N+1
    (["--max-new-tokens", "300", "--min-new-tokens", "300", "a [MASK] b"], "at most 31 new tokens per blank"),
    (["--max-new-tokens", "32", "a [MASK] b [MASK]"], "at most 31 new tokens per blank"),
])
def test_bad_search_input_is_one_line_exit_2(checkpoint, tmp_path, capsys, argv, message):
    (tmp_path / "latin1.txt").write_bytes("fine [MASK]\ncaf\u00e9 [MASK]\n".encode("latin-1"))
    argv = [a.format(tmp=tmp_path) for a in argv]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--model", str(checkpoint), *argv])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("glm-generate: error:") and message in err and "\n" not in err, err


def test_non_utf8_stdin_is_one_line_exit_2(checkpoint):
    done = subprocess.run([sys.executable, "-m", "glm_port.generate", "--model", str(checkpoint)],
                          input=b"fine [MASK]\na \xff [MASK]\n", capture_output=True, timeout=240)
    err = done.stderr.decode().strip()
    assert done.returncode == 2 and err == "glm-generate: error: stdin line 2: not valid UTF-8 (byte 0xff at " \
        "character 3)", err
    assert done.stdout == b""


def test_longest_blanks_the_positions_allow_fill(checkpoint):
    """31 new tokens per blank on 32 positions, two blanks (the second prefill feeds the first span's last
    token at block position 32): fills without an IndexError."""
    out, _ = run(["--model", str(checkpoint), "--json", "--max-new-tokens", "31", "--min-new-tokens", "31",
                  "x [MASK] y [MASK]"])
    (record,) = [json.loads(line) for line in out.splitlines()]
    assert [len(span) for span in record["generated_ids"]] == [31, 31]


def test_temperature_0_is_greedy(checkpoint):
    args = cli.build_parser().parse_args(["--model", "m", "--do-sample", "--temperature", "0", "--top-k", "5", "a"])
    kwargs = cli.generate_kwargs(args)
    assert kwargs["do_sample"] is False and not {"temperature", "top_k", "top_p"} & kwargs.keys()
    greedy, _ = run(["--model", str(checkpoint), "--json", "--max-new-tokens", "6", "the cat [MASK] sat"])
    zero, _ = run(["--model", str(checkpoint), "--json", "--max-new-tokens", "6", "--do-sample", "--temperature", "0",
                   "--seed", "3", "the cat [MASK] sat"])
    assert zero == greedy


def test_marked_form_shows_no_pad(checkpoint):
    """BERT's vocabulary has eos = [PAD]: the prompt's closing eos is no part of the marked form."""
    out, _ = run(["--model", str(checkpoint), "--json", "--max-new-tokens", "3", "a [MASK] b", "longer one [MASK] c d"])
    for record in map(json.loads, out.splitlines()):
        assert "[PAD]" not in record["marked"], record["marked"]
        assert record["marked"].startswith("[CLS] ") and record["marked"].endswith("<|endofpiece|>")


def test_search_flags_reach_generate(checkpoint, generate_calls):
    """--length-penalty (and the other search flags) arrive in generate's arguments, not just in the parsed
    arguments: the parallel-vs-one-process tests share the kwargs builder and would not see them dropped."""
    calls = generate_calls
    run(["--model", str(checkpoint), "--json", "--max-new-tokens", "3", "--num-beams", "3", "--length-penalty",
         "0.37", "--no-repeat-ngram-size", "2", "--min-new-tokens", "1", "--num-return-sequences", "2", "a [MASK]"])
    assert calls and all(c.get("length_penalty") == 0.37 and c.get("num_beams") == 3 and
                         c.get("no_repeat_ngram_size") == 2 and c.get("min_new_tokens") == 1 and
                         c.get("num_return_sequences") == 2 for c in calls), calls
    calls.clear()
    run(["--model", str(checkpoint), "--json", "--max-new-tokens", "3", "--do-sample", "--top-p", "0.61",
         "--top-k", "7", "--temperature", "0.83", "--seed", "1", "a [MASK]"])
    assert calls and all(c.get("do_sample") is True and c.get("top_p") == 0.61 and c.get("top_k") == 7 and
                         c.get("temperature") == 0.83 for c in calls), calls


def test_repetition_penalty_reaches_glm_generate_and_stop_is_refused(checkpoint, generate_calls, capsys):
    calls = generate_calls
    run(["--model", str(checkpoint), "--json", "--max-new-tokens", "3", "--repetition-penalty", "1.4", "a [MASK]"])
    assert calls and all(c.get("repetition_penalty") == 1.4 for c in calls), calls
    calls.clear()
    with pytest.raises(SystemExit) as exit_info:  # GLM's blanks end at eop; a stop string is not ignored silently
        cli.main(["--model", str(checkpoint), "--stop", "x", "a [MASK]"])
    assert exit_info.value.code == 2 and not calls
    err = capsys.readouterr().err.strip()
    assert err == "glm-generate: error: --stop: GLM's blank filling takes no stop strings (each blank ends at its eop)"


def test_glm_generate_and_glm_chat_take_the_same_quantize_options():
    """``--quantize`` and ``--quantize-group-size`` are written once (``generation.options``): the same choices,
    defaults and help in both commands, and the modes are the registry's."""
    from glm_port.chat import build_parser as chat_parser
    from glm_port.generation.cli import build_parser as generate_parser
    from glm_port.generation.options import QUANTIZE_MODES
    from glm_port.models import QUANTIZE_BITS

    def options(parser):
        return {a.dest: (a.option_strings, a.choices, a.default, a.type, a.help) for a in parser._actions
                if a.dest in ("quantize", "quantize_group_size")}

    assert options(generate_parser()) == options(chat_parser()) and len(options(chat_parser())) == 2
    assert tuple(QUANTIZE_MODES) == tuple(QUANTIZE_BITS)


def test_weights_without_a_vocabulary_say_which_tokenizer_ran(checkpoint):
    """glm-pretrain's saves hold no vocabulary: glm-generate runs glm-pretrain's default, the built-in one, and says
    so in one note line on stderr (it used to fall back silently)."""
    out, err = run(["--model", str(checkpoint), "--max-new-tokens", "2", "a [MASK] b"])
    notes = [line for line in err.splitlines() if line.startswith("glm-generate: note:")]
    assert notes == [f"glm-generate: note: {checkpoint} holds no tokenizer: used the built-in TinyWordPieceTokenizer "
                     f"(glm-pretrain's default); name another with --tokenizer-type / --tokenizer-path"]
    named, err = run(["--model", str(checkpoint), "--max-new-tokens", "2", "--tokenizer-type",
                      "TinyWordPieceTokenizer", "a [MASK] b"])
    assert named == out and "note:" not in err


def test_a_hugging_face_glm_directory_without_a_tokenizer_is_one_line(tmp_path, capsys):
    """A Hugging Face directory (config.json + weights) must carry its tokenizer, as transformers' AutoTokenizer
    requires: without one glm-generate refuses (the built-in vocabulary would only generate nonsense for it)."""
    from glm_port.models.glm.weights import save_hf

    config = GLMConfig(vocab_size=tiny_wordpiece().vocab_size, num_layers=1, hidden_size=32, num_attention_heads=2,
                       max_sequence_length=32)
    save_hf(GLMModel(config).state_dict(), tmp_path, {"model_type": "glm", "num_layers": 1, "hidden_size": 32,
                                                      "num_attention_heads": 2, "vocab_size": config.vocab_size,
                                                      "max_sequence_length": 32})
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--model", str(tmp_path), "--max-new-tokens", "2", "a [MASK]"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and "\n" not in err
    assert err == (f"glm-generate: error: {tmp_path}: no tokenizer beside the weights (no vocabulary file or "
                   f"tokenizer_config.json): name it with --tokenizer-path (and --tokenizer-type)")
