"""glm-pretrain end to end in one process: upstream's log line, falling loss, exact resume, flags, errors."""

import json
import re

import pytest

from glm_port.arguments import parse_args
from glm_port.models.glm.model import GLMTransformer
from glm_port import pretrain_glm
from glm_port.pretrain_glm import compile_by_default, compile_mode_by_default, main, model_config
from glm_port.training import log_line

TINY = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "32",
        "--batch-size", "2", "--log-interval", "1", "--eval-iters", "2"]
LOG_LINE = re.compile(
    r"^ iteration +(\d+)/ +(\d+) \| elapsed time per iteration \(ms\): \d+\.\d \| "
    r"learning rate \d\.\d{3}E[+-]\d\d \| lm loss (\d\.\d{6}E[+-]\d\d) \|$",
    re.MULTILINE,
)


def logged_losses(text: str) -> dict[int, float]:
    return {int(m[1]): float(m[3]) for m in LOG_LINE.finditer(text)}


def run(capsys, *argv) -> dict[int, float]:
    main([*TINY, *argv])
    return logged_losses(capsys.readouterr().out)


def test_log_line_is_upstreams_character_for_character():
    assert log_line(5, 200, 12.345, 1e-4, 2.5) == (
        " iteration        5/     200 | elapsed time per iteration (ms): 12.3 | learning rate 1.000E-04 |"
        " lm loss 2.500000E+00 |"
    )
    assert log_line(1, 2, 1.0, 1.0, 1.0, loss_scale=65536.0).endswith("| loss scale 65536.0 |")


def test_trains_with_falling_loss(capsys):
    losses = run(capsys, "--train-iters", "16", "--lr", "3e-3", "--log-interval", "8")
    assert sorted(losses) == [8, 16]
    assert losses[16] < losses[8]


def test_train_then_resume_equals_straight(tmp_path, capsys):
    """Train 3 + resume 3 = 6 straight, loss for loss (dropout on: the RNG state resumes too)."""
    schedule = ["--lr-decay-iters", "6", "--lr-decay-style", "cosine", "--warmup", "0.2"]
    straight = run(capsys, "--train-iters", "6", *schedule)
    first = run(capsys, "--train-iters", "3", "--save", str(tmp_path), *schedule)
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "3"
    second = run(capsys, "--train-iters", "6", "--load", str(tmp_path), "--save", str(tmp_path), *schedule)
    assert sorted(straight) == list(range(1, 7))
    assert {**first, **second} == straight
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "6"
    assert (tmp_path / "6" / "mp_rank_00_model_states.pt").is_file()


def test_unsupported_upstream_flag_is_refused_by_name(capsys):
    with pytest.raises(SystemExit):
        main(["--masked-lm"])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error == ("glm-pretrain: error: upstream flag --masked-lm is not supported: "
                     "another model or objective than GLM blank infilling")
    with pytest.raises(SystemExit):
        main(["--eval-epoch=1"])
    assert "upstream flag --eval-epoch is not supported" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--no-such-flag"])
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


def test_upstream_flag_prefixes_are_not_abbreviations(capsys):
    with pytest.raises(SystemExit):
        main(["--load-pretrained", "x"])  # upstream's fine-tuning flag, not --load
    assert "upstream flag --load-pretrained is not supported" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--train-data", "missing.jsonl"], "--train-data missing.jsonl: no such file"),
    (["--tokenizer-type", "BertWordPieceTokenizer", "--tokenizer-path", "nowhere/vocab.txt"],
     "--tokenizer-path nowhere/vocab.txt: no such file or directory"),
    (["--load", "no/such/dir"], "--load no/such/dir: no such file or directory"),
    (["--seq-length", "64", "--max-position-embeddings", "32"], "--seq-length 64 exceeds"),
    (["--fp16", "--bf16"], "--fp16 and --bf16 are exclusive"),
    (["--checkpoint-policy", "some"], "argument --checkpoint-policy: invalid choice: 'some'"),
])
def test_bad_input_is_one_clear_line(capsys, argv, message):
    with pytest.raises(SystemExit):
        main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert message in lines[-1]


def test_checkpoint_of_another_architecture_is_refused_and_left_alone(tmp_path, capsys):
    main([*TINY, "--hidden-size", "64", "--train-iters", "1", "--save", str(tmp_path)])
    capsys.readouterr()
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    with pytest.raises(SystemExit) as exit_info:
        main([*TINY, "--train-iters", "2", "--load", str(tmp_path), "--save", str(tmp_path)])
    assert exit_info.value.code == 2
    message = capsys.readouterr().err.strip()
    assert message.startswith("glm-pretrain: error: ") and "\n" not in message
    assert "does not fit this model: word_embeddings.weight is [384, 64] there, [384, 32] here" in message
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == files


def test_heads_that_do_not_divide_the_hidden_size(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*TINY, "--num-attention-heads", "3"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip() == "glm-pretrain: error: hidden size 32 is not divisible by 3 attention heads"


@pytest.mark.parametrize("argv, expected", [
    ([], (False, "full")),
    (["--checkpoint-activations"], (True, "full")),
    (["--checkpoint-policy", "selective"], (True, "selective")),  # a policy turns checkpointing on
    (["--checkpoint-activations", "--checkpoint-policy", "full"], (True, "full")),
])
def test_checkpoint_flags_reach_the_model_config(argv, expected):
    config = model_config(parse_args(argv), vocab_size=128)
    assert (config.checkpoint_activations, config.checkpoint_policy) == expected


def test_compile_flag_compiles_the_layers(monkeypatch, capsys):
    # compile_layers itself is tested in test_model_training; here only that the flag reaches it.
    compiled = []
    monkeypatch.setattr(GLMTransformer, "compile_layers", lambda self, **options: compiled.append(len(self.layers)))
    assert run(capsys, "--train-iters", "1", "--compile")
    assert compiled == [1]


def test_compile_mode_is_cuda_graphs_on_cuda_and_can_be_chosen(monkeypatch, capsys):
    assert compile_mode_by_default("cuda:0") == "reduce-overhead" and compile_mode_by_default("cpu") == "default"
    modes = []
    monkeypatch.setattr(GLMTransformer, "compile_layers", lambda self, **options: modes.append(options["mode"]))
    assert run(capsys, "--train-iters", "1", "--compile")
    assert run(capsys, "--train-iters", "1", "--compile", "--compile-mode", "max-autotune-no-cudagraphs")
    assert modes == ["default", "max-autotune-no-cudagraphs"]


def test_compile_is_the_cuda_default_and_no_compile_turns_it_off(monkeypatch, capsys):
    assert compile_by_default("cuda") and compile_by_default("cuda:1") and not compile_by_default("cpu")
    compiled = []
    monkeypatch.setattr(GLMTransformer, "compile_layers", lambda self, **options: compiled.append(len(self.layers)))
    assert run(capsys, "--train-iters", "1")  # on this CPU: eager by default
    monkeypatch.setattr(pretrain_glm, "compile_by_default", lambda device: True)  # as on a CUDA device
    assert run(capsys, "--train-iters", "1", "--no-compile")
    assert compiled == []
    main([*TINY, "--train-iters", "1"])
    assert compiled == [1]
    out = capsys.readouterr().out
    assert "first iteration:" in out and "torch.compile included" in out


def test_deepspeed_config_fields(tmp_path):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({
        "train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 2, "gradient_clipping": 0.5,
        "fp16": {"enabled": True, "loss_scale": 0},
        "optimizer": {"type": "Adam", "params": {"lr": 4e-4, "weight_decay": 0.1, "betas": [0.9, 0.98],
                                                 "eps": 1e-6}},
        "activation_checkpointing": {"partition_activations": False},
    }))
    args = parse_args(["--deepspeed", "--deepspeed_config", str(config), "--batch-size", "16"])
    assert (args.batch_size, args.gradient_accumulation_steps, args.clip_grad) == (3, 2, 0.5)
    assert args.fp16 and args.loss_scale is None  # 0 = dynamic, as in DeepSpeed
    assert (args.lr, args.weight_decay, args.adam_beta1, args.adam_beta2, args.adam_eps) == (
        4e-4, 0.1, 0.9, 0.98, 1e-6)


@pytest.mark.parametrize("extra,message", [
    ({"optimizer": {"type": "Lamb"}}, "optimizer 'Lamb' is not supported"),
    ({"scheduler": {"type": "WarmupLR"}}, "a DeepSpeed 'scheduler' is not supported"),
    ({"zero_optimization": {"stage": 4}}, "ZeRO stage 4 is not supported"),
])
def test_deepspeed_config_that_cannot_be_honoured(tmp_path, capsys, extra, message):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps(extra))
    with pytest.raises(SystemExit):
        parse_args(["--deepspeed_config", str(config)])
    assert message in capsys.readouterr().err


def test_deepspeed_train_batch_size_must_add_up(tmp_path, capsys):
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2}))
    with pytest.raises(SystemExit) as exit_info:
        main([*TINY, "--deepspeed_config", str(config)])
    assert "train_batch_size 8 != micro batch 2 x accumulation 1 x data-parallel 1" in capsys.readouterr().err


def test_load_says_what_it_loaded_and_stops_when_already_trained(tmp_path, capsys):
    main([*TINY, "--train-iters", "2", "--save", str(tmp_path)])
    capsys.readouterr()
    main([*TINY, "--train-iters", "3", "--load", str(tmp_path), "--save", str(tmp_path)])
    out = capsys.readouterr().out
    assert f" loaded checkpoint {tmp_path / '2'} at iteration 2\n" in out
    assert sorted(logged_losses(out)) == [3]
    # --load at 3 with --train-iters 3: one line says so, and main returns (exit 0) without training or saving
    files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    main([*TINY, "--train-iters", "3", "--load", str(tmp_path), "--save", str(tmp_path)])
    out = capsys.readouterr().out
    assert f" loaded checkpoint {tmp_path / '3'} at iteration 3\n" in out
    assert " nothing to train: the checkpoint is at iteration 3 and --train-iters is 3" in out
    assert logged_losses(out) == {}
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == files


def test_corrupt_latest_checkpoint_points_at_the_previous_good_one(tmp_path, capsys):
    main([*TINY, "--train-iters", "2", "--save-interval", "1", "--save", str(tmp_path)])
    capsys.readouterr()
    latest = tmp_path / "2" / "mp_rank_00_model_states.pt"
    latest.write_bytes(latest.read_bytes()[:1000])  # cut short, as a full disk would
    with pytest.raises(SystemExit) as exit_info:
        main([*TINY, "--train-iters", "3", "--load", str(tmp_path)])
    message = capsys.readouterr().err.strip()
    assert message.startswith(f"glm-pretrain: error: {latest}: not a readable checkpoint") and "\n" not in message
    assert message.endswith(f"; the previous checkpoint, iteration 1, is intact: --load {tmp_path / '1'}")
    main([*TINY, "--train-iters", "3", "--load", str(tmp_path / "1")])  # which works
    assert f" loaded checkpoint {tmp_path / '1'} at iteration 1\n" in capsys.readouterr().out


def test_readme_and_help_quote_the_same_time_for_the_default_run():
    from pathlib import Path

    from glm_port.arguments import build_parser

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    (run_line,) = [line for line in readme.splitlines() if line.startswith("glm-pretrain ") and "time glm-pretrain" in line]
    quoted = re.findall(r"about (\d+) s\b", run_line)
    assert quoted and quoted == re.findall(r"about (\d+) s\b", build_parser().description)
