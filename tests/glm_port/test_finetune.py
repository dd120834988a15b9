"""glm-finetune end to end on the embedded task: full and LoRA, evaluation, outputs, bad input, TP 2 = 1 process."""

import argparse
import contextlib
import io
import json
import re

import pytest
import torch
import torch.distributed as dist

from glm_port.finetune.run import main

from ..conftest import torchrun, torchrun_mains

LOSS = re.compile(r"^ iteration +(\d+)/ +\d+ \| .* \| lm loss (\S+) \|$", re.MULTILINE)
EVAL = re.compile(r"^ eval(?: at step (\d+))? \| rouge-1 +(\S+) \| rouge-2 +(\S+) \| rouge-l +(\S+) \|", re.MULTILINE)
QUICK = ["--max_steps", "6", "--logging_steps", "1", "--eval_steps", "0", "--per_device_eval_batch_size", "8"]


def _tiny_chatglm2_finetune_argv(tmp_path, *extra, **config):
    """glm-finetune's arguments (TP_ARGV's) for a full finetune of the embedded tiny ChatGLM2 (``config``:
    fields changed) saved under ``tmp_path/base`` (each rank loads its slices of it) on the toy task."""
    from glm_port.finetune.toy_task import write_toy_task
    from glm_port.models.chatglm2.finetune import save
    from glm_port.models.chatglm2.tiny import build_tiny

    (tmp_path / "tokenizer").mkdir()
    save(*build_tiny(str(tmp_path / "tokenizer"), **config), tmp_path / "base")
    return [*TP_ARGV, "--model_name_or_path", str(tmp_path / "base"), "--do_train", "--train_file",
            str(write_toy_task(tmp_path / "data")[0]), "--src_length", "12", "--tgt_length", "10",
            "--per_device_train_batch_size", "32", *extra]


def _assert_one_process_run(tmp_path, capsys, logs, argv, full):
    """The parallel runs' logs (LoRA ``argv``, then ``full``) give one process's losses (1e-4), and the
    LoRA adapter saved under ``tp`` is the one saved by one process under ``one`` (whole, THUDM's row order)."""
    from safetensors.torch import load_file

    for log, run in zip(logs, (argv, full)):
        parallel = _losses(log)
        single = _losses(_run([*run, "--output_dir", str(tmp_path / ("one" if run is argv else "one_full"))], capsys))
        assert sorted(parallel) == sorted(single) == [1, 2, 3, 4]
        for step, loss in single.items():
            assert parallel[step] == pytest.approx(loss, rel=1e-4), step
    tp_adapter, one_adapter = (load_file(tmp_path / d / "final" / "adapter_model.safetensors") for d in ("tp", "one"))
    assert tp_adapter.keys() == one_adapter.keys()
    for key, value in one_adapter.items():
        torch.testing.assert_close(tp_adapter[key], value, rtol=1e-3, atol=1e-5, msg=key)


def _assert_one_process_logits(tmp_path, *directories):
    """Each of ``directories`` (a TP full finetune's shards, merged or as saved) loads through ChatGLM2's
    ``load_pretrained`` and gives the logits (1e-4) of the model the one-process full finetune saved."""
    from glm_port.models.chatglm2.weights import load_pretrained

    ids = torch.tensor([[5, 17, 42, 99, 7, 300, 11, 64], [790, 792, 8, 9, 10, 11, 12, 13]])
    with torch.no_grad():
        single = load_pretrained(tmp_path / "one_full" / "final")(ids).logits
        for directory in directories:
            torch.testing.assert_close(load_pretrained(directory)(ids).logits, single, rtol=1e-4, atol=1e-4,
                                       msg=str(directory))
    return ids, single


def _losses(text):
    return {int(m[1]): float(m[2]) for m in LOSS.finditer(text)}


def _run(argv, capsys):
    main(argv)
    return capsys.readouterr().out


def test_full_finetune_trains_evaluates_and_saves_a_loadable_model(tmp_path, capsys):
    out = _run([*QUICK, "--output_dir", str(tmp_path), "--num_beams", "2"], capsys)
    losses = _losses(out)
    assert sorted(losses) == list(range(1, 7)) and losses[6] < losses[1]
    assert "trainable parameters: 462,592 of 462,592 (100.000%)" in out
    results = json.loads((tmp_path / "eval_results.json").read_text())
    assert set(results) == {"rouge-1", "rouge-2", "rouge-l", "bleu-4"}
    predictions = [json.loads(line) for line in (tmp_path / "eval_predictions.jsonl").read_text().splitlines()]
    assert len(predictions) == 48 and {"source", "target", "prediction"} <= set(predictions[0])
    from glm_port import GLMForConditionalGeneration

    reloaded = GLMForConditionalGeneration.from_pretrained(tmp_path / "final")
    assert reloaded.glm.config.num_layers == 2
    # --do_eval alone on the saved model scores what the training run scored at its end.
    again = _run(["--model_name_or_path", str(tmp_path / "final"), "--do_eval", "--eval_file",
                  str(tmp_path / "toy_task" / "dev.json"), "--src_length", "12", "--tgt_length", "10",
                  "--num_beams", "2", "--output_dir", str(tmp_path / "eval_only")], capsys)
    assert json.loads((tmp_path / "eval_only" / "eval_results.json").read_text()) == results, again


def test_lora_trains_adapters_only_and_saves_them_in_peft_format(tmp_path, capsys):
    out = _run([*QUICK, "--lora", "--do_eval", "false", "--output_dir", str(tmp_path)], capsys)
    share = float(re.search(r"trainable parameters: [\d,]+ of [\d,]+ \(([\d.]+)%\)", out)[1])
    assert 0 < share < 10
    adapter = tmp_path / "final"
    assert json.loads((adapter / "adapter_config.json").read_text())["target_modules"] == ["query_key_value"]
    assert not (adapter / "model.safetensors").exists()  # the adapter alone
    # Applied onto the base it was made for it evaluates; onto another base it is one clear error.
    base = tmp_path / "other_base"
    from glm_port import GLMConfig, GLMForConditionalGeneration
    from glm_port.data import get_tokenizer
    from glm_port.models.glm.tokenizer import GLMTokenizer

    vocab = get_tokenizer()
    config = GLMConfig(vocab_size=vocab.vocab_size, num_layers=2, hidden_size=64, num_attention_heads=4,
                       max_sequence_length=64)
    GLMForConditionalGeneration(config).save_pretrained(base)
    GLMTokenizer(vocab).save_pretrained(base)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["--model_name_or_path", str(base), "--lora_path", str(adapter), "--do_eval", "--eval_file",
              str(tmp_path / "toy_task" / "dev.json"), "--output_dir", str(tmp_path / "x")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was made for another base model: size mismatch" in err[0], err


def test_lora_checkpoints_hold_the_adapters_alone_and_resume_on_the_base_exactly(tmp_path, capsys):
    """--lora's resumable checkpoints keep the adapters (with the optimizer, schedule and RNG), not the frozen
    base; a run killed after step 3 and started again takes steps 4-6 as the uninterrupted run did: the same
    losses (dropout included) and the same final adapter, bit for bit. A full finetune started in that
    --output_dir is one line: the base is not in them."""
    import shutil

    from safetensors.torch import load_file

    out = tmp_path / "out"
    argv = [*QUICK, "--lora", "--do_eval", "false", "--save_steps", "3", "--output_dir", str(out)]
    whole = _losses(_run(argv, capsys))
    assert sorted(whole) == [1, 2, 3, 4, 5, 6]
    saved = torch.load(out / "checkpoints" / "3" / "mp_rank_00_model_states.pt", weights_only=True)
    assert "module" not in saved and saved["trained_part"] == "LoRA adapters"
    assert saved["trainable"] and all(".lora_A." in k or ".lora_B." in k for k in saved["trainable"])
    assert saved["optimizer"]["state"] and "lr_scheduler" in saved and "torch_rng_state" in saved
    first = load_file(out / "final" / "adapter_model.safetensors")
    (out / "checkpoints" / "latest_checkpointed_iteration.txt").write_text("3")  # killed after saving step 3
    shutil.rmtree(out / "checkpoints" / "6")
    shutil.rmtree(out / "final")
    log = _run(argv, capsys)
    assert " > resumed from" in log and sorted(_losses(log)) == [4, 5, 6]
    assert _losses(log) == {step: loss for step, loss in whole.items() if step > 3}
    again = load_file(out / "final" / "adapter_model.safetensors")
    assert again.keys() == first.keys() and all(torch.equal(again[k], first[k]) for k in first)
    with pytest.raises(SystemExit) as exit_info:
        main([*QUICK, "--do_eval", "false", "--output_dir", str(out)])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "holds only the LoRA adapters of a run on the embedded glm-tiny (the frozen base is not in it), not the "
        "whole model this run trains")


@pytest.mark.parametrize("argv, message", [
    (["--do_train"], "--do_train needs --train_file"),
    (["--do_train", "--train_file", "missing.json"], "--train_file missing.json: no such file"),
    (["--model_name_or_path", "nowhere", "--do_eval", "--eval_file", __file__], "nowhere: no such file or directory"),
    (["--lora", "--lora_target_modules", "qkv", "--max_steps", "1"], "the model has no module named 'qkv'"),
    (["--lora", "--merge_tensor_parallel_path", "merged", "--max_steps", "1"],  # refused before training, not after
     "--merge_tensor_parallel_path with LoRA: the adapter is saved whole"),
])
def test_bad_input_is_one_line_and_exit_2(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--output_dir", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_a_missing_field_names_file_line_and_field(tmp_path, capsys):
    data = tmp_path / "train.json"
    data.write_text('{"source": "a b", "target": "b a"}\n{"source": "c d"}\n', encoding="utf-8")
    with pytest.raises(SystemExit):
        main(["--do_train", "--train_file", str(data), "--output_dir", str(tmp_path / "out")])
    assert f"{data}:2: sample lacks the field 'target'" in capsys.readouterr().err


# ---- tensor parallel 2 logs the losses of one process ----------------------------------------------------

TP_ARGV = ["--do_eval", "false", "--max_steps", "4", "--logging_steps", "1", "--learning_rate", "3e-3"]


def _run_ranks(tmp_path, *runs, world=2):
    """glm-finetune on ``world`` gloo ranks of one torchrun launch (tensor parallel ``world`` unless an argv
    names its degree), once per argv of ``runs``; rank 0's logs."""
    runs = runs or ([*TP_ARGV, "--output_dir", str(tmp_path / "tp")],)
    runs = [[*argv, *([] if "--tensor_parallel_degree" in argv else ["--tensor_parallel_degree", str(world)])]
            for argv in runs]
    return [per_rank[0] for per_rank in torchrun_mains("glm_port.finetune.run:main", runs, world, tmp_path)]


def _assert_tp_shards_give_one_process_logits(tp_final, one_final):
    """The final step's two ``mp_rank_XX`` shards (upstream's per-rank layout, with the config), loaded at
    tensor-parallel size 1 (merged by Megatron's rules), give the logits of the model one process saved."""
    shards = sorted((tp_final / "4").glob("mp_rank_*_model_states.pt"))
    assert [p.name for p in shards] == ["mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"]
    from glm_port import GLMForConditionalGeneration

    merged = GLMForConditionalGeneration.from_pretrained(tp_final).glm.eval()
    single_model = GLMForConditionalGeneration.from_pretrained(one_final).glm.eval()
    ids = torch.arange(2, 18).view(2, 8)
    positions = torch.stack((torch.arange(8), torch.zeros(8, dtype=torch.long))).expand(2, 2, 8)
    with torch.no_grad():
        torch.testing.assert_close(merged(ids, positions, torch.tensor([4, 4]))[0],
                                   single_model(ids, positions, torch.tensor([4, 4]))[0], rtol=1e-4, atol=1e-4)


def test_tensor_parallel_finetune_logs_the_losses_of_one_process(tmp_path, capsys):
    parallel = _losses(_run_ranks(tmp_path)[0])
    single = _losses(_run([*TP_ARGV, "--output_dir", str(tmp_path / "one")], capsys))
    assert sorted(parallel) == sorted(single) == [1, 2, 3, 4]
    for step, loss in single.items():
        assert parallel[step] == pytest.approx(loss, rel=1e-4), step
    _assert_tp_shards_give_one_process_logits(tmp_path / "tp" / "final", tmp_path / "one" / "final")


def test_tensor_parallel_2_finetunes_the_embedded_chatglm2_tiny_as_one_process(tmp_path, capsys):
    """--model_name_or_path chatglm2-tiny at --tensor_parallel_degree 2: each rank holds its slices of the one model
    a single process builds (each rank used to build its shards at random: 6.9768 against 6.9319 at step 1), so the
    losses are one process's (1e-4) and the shards saved give the logits of the model one process saved."""
    from glm_port.models.chatglm2.weights import load_pretrained

    argv = ["--model_name_or_path", "chatglm2-tiny", *TP_ARGV, "--max_steps", "3"]
    parallel = _losses(_run_ranks(tmp_path, [*argv, "--output_dir", str(tmp_path / "tp")])[0])
    single = _losses(_run([*argv, "--output_dir", str(tmp_path / "one")], capsys))
    assert sorted(parallel) == sorted(single) == [1, 2, 3]
    for step, loss in single.items():
        assert parallel[step] == pytest.approx(loss, rel=1e-4), step
    ids = torch.tensor([[5, 17, 42, 99, 7, 300, 11, 64]])
    with torch.no_grad():
        torch.testing.assert_close(load_pretrained(tmp_path / "tp" / "final")(ids).logits,
                                   load_pretrained(tmp_path / "one" / "final")(ids).logits, rtol=1e-4, atol=1e-4)


def test_sharded_finetune_logs_the_losses_of_one_process_and_saves_the_whole_model(tmp_path, capsys):
    """--sharding stage3 on 2 ranks (FSDP2, each at batch 16) == one process at batch 32: the same losses and
    evaluation scores (beam search through the sharded model), the final model saved whole (as one process
    saves it), and the step-2 checkpoint as DCP shards; ChatGLM2 at stage 2 likewise (losses, saved model)."""
    argv = [*TP_ARGV, "--do_eval", "true", "--max_steps", "4", "--save_steps", "2", "--num_beams", "2",
            "--per_device_eval_batch_size", "48"]
    # ChatGLM2 too (its logits call model.transformer, then the output layer's weight: run as the root's forward)
    chatglm2 = ["--model_name_or_path", "chatglm2-tiny", *TP_ARGV, "--max_steps", "3"]
    log, chatglm2_log = _run_ranks(
        tmp_path, [*argv, "--tensor_parallel_degree", "1", "--sharding", "stage3", "--per_device_train_batch_size",
                   "16", "--output_dir", str(tmp_path / "fsdp")],
        [*chatglm2, "--tensor_parallel_degree", "1", "--sharding", "stage2", "--per_device_train_batch_size", "16",
         "--output_dir", str(tmp_path / "chatglm2_fsdp")])
    single = _losses(_run([*chatglm2, "--per_device_train_batch_size", "32", "--output_dir",
                           str(tmp_path / "chatglm2_one")], capsys))
    assert sorted(_losses(chatglm2_log)) == sorted(single) == [1, 2, 3]
    for step, loss in single.items():
        assert _losses(chatglm2_log)[step] == pytest.approx(loss, rel=1e-4), step
    from glm_port.models.chatglm2.weights import load_pretrained

    ids = torch.tensor([[5, 17, 42, 99, 7, 300, 11, 64]])
    with torch.no_grad():
        torch.testing.assert_close(load_pretrained(tmp_path / "chatglm2_fsdp" / "final")(ids).logits,
                                   load_pretrained(tmp_path / "chatglm2_one" / "final")(ids).logits,
                                   rtol=1e-4, atol=1e-4)
    assert " > --sharding stage3: FSDP2 over 2 ranks" in log
    single_log = _run([*argv, "--per_device_train_batch_size", "32", "--output_dir", str(tmp_path / "one")], capsys)
    parallel, single = _losses(log), _losses(single_log)
    assert sorted(parallel) == sorted(single) == [1, 2, 3, 4]
    for step, loss in single.items():
        assert parallel[step] == pytest.approx(loss, rel=1e-4), step
    assert [m.groups() for m in EVAL.finditer(log)] == [m.groups() for m in EVAL.finditer(single_log)]
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "training_state.pt"} <= {
        p.name for p in (tmp_path / "fsdp" / "checkpoints" / "2").iterdir()}
    from glm_port import GLMForConditionalGeneration

    sharded = GLMForConditionalGeneration.from_pretrained(tmp_path / "fsdp" / "final").glm.eval()
    single_model = GLMForConditionalGeneration.from_pretrained(tmp_path / "one" / "final").glm.eval()
    ids = torch.arange(2, 18).view(2, 8)
    positions = torch.stack((torch.arange(8), torch.zeros(8, dtype=torch.long))).expand(2, 2, 8)
    with torch.no_grad():
        torch.testing.assert_close(sharded(ids, positions, torch.tensor([4, 4]))[0],
                                   single_model(ids, positions, torch.tensor([4, 4]))[0], rtol=1e-4, atol=1e-4)


def test_sharded_tensor_parallel_finetune_logs_the_losses_of_one_process(tmp_path, capsys):
    """--sharding stage3 with --tensor_parallel_degree 2 on 4 ranks (FSDP2 over the dp dimension of the (dp, tp)
    mesh, each dp rank at batch 16) == one process at batch 32: the same losses and scores, the step-2
    checkpoint as DCP shards, the final model saved as tensor parallel saves it (mp_rank_XX), merging into the
    one-process model."""
    scored = [*TP_ARGV, "--do_eval", "true", "--num_beams", "2", "--per_device_eval_batch_size", "48"]
    argv = [*scored, "--save_steps", "2", "--sharding", "stage3", "--per_device_train_batch_size", "16"]
    # torchrun, as a user launches it (glm_port.finetune as the module run)
    done = torchrun(["-m", "glm_port.finetune", *argv, "--tensor_parallel_degree", "2", "--output_dir",
                     str(tmp_path / "tp")], 4)
    assert done.returncode == 0, done.stderr[-3000:]
    log = done.stdout
    assert " > --sharding stage3: FSDP2 over 2 ranks" in log
    single_log = _run([*scored, "--per_device_train_batch_size", "32", "--output_dir", str(tmp_path / "one")],
                      capsys)
    parallel, single = _losses(log), _losses(single_log)
    assert sorted(parallel) == sorted(single) == [1, 2, 3, 4]
    for step, loss in single.items():
        assert parallel[step] == pytest.approx(loss, rel=1e-4), step
    # evaluation (beam search through the TP x FSDP model) scores as one process's
    assert [m.groups() for m in EVAL.finditer(log)] == [m.groups() for m in EVAL.finditer(single_log)] != []
    assert {".metadata", *(f"__{r}_0.distcp" for r in range(4)), "training_state.pt"} <= {
        p.name for p in (tmp_path / "tp" / "checkpoints" / "2").iterdir()}
    _assert_tp_shards_give_one_process_logits(tmp_path / "tp" / "final", tmp_path / "one" / "final")


def test_sharded_tensor_parallel_chatglm2_with_replicated_key_value_rows_trains_as_one_process(tmp_path, capsys):
    """ChatGLM2 with ONE key/value group at --tensor_parallel_degree 2 (both ranks hold it) x --sharding stage2 and
    stage3 on 4 ranks, clipping every step: one process's losses (1e-4), the final model saved as mp_rank_XX
    shards that load with one process's logits; --bf16 at stage 3 (bf16 compute on fp32 shards) tracks the
    one-process bf16 run (2%)."""
    full = _tiny_chatglm2_finetune_argv(tmp_path, "--max_grad_norm", "0.05", multi_query_group_num=1)
    # tensor parallel 2 x 2 data-parallel ranks at batch 16: 32 a step, as one process
    sharded = [*full, "--tensor_parallel_degree", "2", "--per_device_train_batch_size", "16"]
    logs = _run_ranks(tmp_path, [*sharded, "--sharding", "stage2", "--output_dir", str(tmp_path / "stage2")],
                      [*sharded, "--sharding", "stage3", "--output_dir", str(tmp_path / "stage3")],
                      [*sharded, "--sharding", "stage3", "--bf16", "--output_dir", str(tmp_path / "bf16")],
                      world=4)
    for log in logs:
        assert " > --sharding stage" in log and "FSDP2 over 2 ranks" in log
    single = _losses(_run([*full, "--output_dir", str(tmp_path / "one_full")], capsys))
    single_bf16 = _losses(_run([*full, "--bf16", "--output_dir", str(tmp_path / "one_bf16")], capsys))
    assert sorted(single) == [1, 2, 3, 4]
    for log in logs[:2]:
        parallel = _losses(log)
        assert sorted(parallel) == [1, 2, 3, 4]
        for step, loss in single.items():
            assert parallel[step] == pytest.approx(loss, rel=1e-4), step
    bf16 = _losses(logs[2])
    for step, loss in single_bf16.items():
        assert bf16[step] == pytest.approx(loss, rel=0.02), step
    assert sorted(p.name for p in (tmp_path / "stage2" / "final" / "4").iterdir()) == [
        "mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"]
    _assert_one_process_logits(tmp_path, tmp_path / "stage2" / "final", tmp_path / "stage3" / "final")


def test_sharding_in_one_process_says_there_is_nothing_to_shard(tmp_path, capsys):
    out = _run(["--sharding", "stage2", "--max_steps", "1", "--logging_steps", "1", "--do_eval", "false",
                "--output_dir", str(tmp_path)],
               capsys)
    assert " > --sharding stage2: one process, nothing to shard (launch with torchrun)" in out
    assert _losses(out).keys() == {1} and (tmp_path / "final" / "model.safetensors").is_file()


@pytest.mark.parametrize("argv, world, message", [
    (["--sharding", "stage2", "--sharding_degree", "3"], "4", "--sharding_degree 3 does not divide the 4 data-parallel"),
    (["--sharding", "stage3", "--lora"], "2", "--sharding stage3 with LoRA is not supported"),
    (["--sharding", "stage2", "--model_name_or_path", "chatglm2-tiny", "--pre_seq_len", "4"], "2",
     "--sharding stage2 with P-Tuning is not supported"),
    (["--sharding", "stage3", "--tensor_parallel_degree", "2", "--sharding_degree", "1"], "4",
     "--sharding_degree 1 with --tensor_parallel_degree > 1 is not supported"),
    (["--sharding", "stage4"], "2", "--sharding 'stage4': choose stage1, stage2 or stage3"),
])
def test_bad_sharding_is_one_line_exit_2_and_nothing_written(argv, world, message, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", world)  # as torchrun sets it; refused before any process group starts
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--output_dir", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and len([line for line in err if "error" in line]) == 1, err
    assert not (tmp_path / "out").exists() and not dist.is_initialized()


def test_tensor_parallel_lora_logs_the_losses_of_one_process_and_saves_the_whole_adapter(tmp_path, capsys):
    """LoRA on the split query_key_value (stride 3): TP 2 trains as one process does, and the adapter it saves
    is PEFT's whole adapter, which plain PEFT applies at tensor-parallel size 1."""
    lora = ["--lora", "--lora_target_modules", "query_key_value,dense"]  # a column- and a row-split layer
    # Then the whole adapter saved at TP 2 is loaded at TP 2 (sliced) and at TP 1: the same first loss.
    again = [*TP_ARGV, "--max_steps", "1", "--lora_path", str(tmp_path / "tp" / "final")]
    parallel, parallel_again = map(_losses, _run_ranks(
        tmp_path, [*TP_ARGV, *lora, "--output_dir", str(tmp_path / "tp")],
        [*again, "--output_dir", str(tmp_path / "tp_again")]))
    single = _losses(_run([*TP_ARGV, *lora, "--output_dir", str(tmp_path / "one")], capsys))
    assert sorted(parallel) == sorted(single) == [1, 2, 3, 4]
    for step, loss in single.items():
        assert parallel[step] == pytest.approx(loss, rel=1e-4), step
    single_again = _losses(_run([*again, "--output_dir", str(tmp_path / "one_again")], capsys))
    assert parallel_again[1] == pytest.approx(single_again[1], rel=1e-4)
    assert parallel_again[1] < parallel[1] - 0.05  # the trained adapter was applied (not a fresh one)
    import peft
    from safetensors.torch import load_file

    from glm_port import GLMForConditionalGeneration
    from glm_port.finetune.lora import register

    tp_adapter, one_adapter = (load_file(tmp_path / d / "final" / "adapter_model.safetensors") for d in ("tp", "one"))
    assert {k: v.shape for k, v in tp_adapter.items()} == {k: v.shape for k, v in one_adapter.items()}
    qkv_b = next(k for k in tp_adapter if k.endswith("query_key_value.lora_B.weight"))
    hidden = GLMForConditionalGeneration.from_pretrained(tmp_path / "one" / "base").glm.config.hidden_size
    assert tp_adapter[qkv_b].shape == (3 * hidden, 8)  # whole: Q | K | V rows of both ranks
    assert one_adapter[qkv_b].abs().max() > 0  # trained (B starts at zero)
    ids = torch.arange(2, 18).view(2, 8)
    positions = torch.stack((torch.arange(8), torch.zeros(8, dtype=torch.long))).expand(2, 2, 8)

    def logits(adapter_dir):  # the adapter applied by PEFT in one process (as --lora_path does)
        base = GLMForConditionalGeneration.from_pretrained(tmp_path / "one" / "base").glm
        if adapter_dir:
            config = register(peft.LoraConfig.from_pretrained(str(adapter_dir)))  # Linear1D's skip_bias_add
            peft.PeftModel.from_pretrained(base, str(adapter_dir), config=config)
        with torch.no_grad():
            return base.eval()(ids, positions, torch.tensor([4, 4]))[0]

    one = logits(tmp_path / "one" / "final")
    torch.testing.assert_close(logits(tmp_path / "tp" / "final"), one, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(logits(None), one, atol=1e-3)  # the adapter matters
    # The embedded base the TP run kept (its shards) is the one-process run's base.
    tp_base = GLMForConditionalGeneration.from_pretrained(tmp_path / "tp" / "base").glm.eval()
    with torch.no_grad():
        torch.testing.assert_close(tp_base(ids, positions, torch.tensor([4, 4]))[0], logits(None))


def test_tensor_parallel_lora_resumes_from_its_adapter_slices_as_the_uninterrupted_run(tmp_path):
    """A TP 2 LoRA run stopped after step 2 (each rank saved its adapter slices, not the frozen base) and
    started again to step 4 in that --output_dir takes steps 3-4 as the uninterrupted TP 2 run did: the same
    losses and the same final adapter (1e-6). A constant learning rate: --max_steps sets a linear decay's end."""
    from safetensors.torch import load_file

    lora = [*TP_ARGV, "--lora", "--lora_target_modules", "query_key_value,dense", "--save_steps", "2",
            "--lr_scheduler_type", "constant"]
    stopped = [*lora, "--output_dir", str(tmp_path / "resumed")]
    whole, first, resumed = map(_losses, _run_ranks(
        tmp_path, [*lora, "--output_dir", str(tmp_path / "whole")], [*stopped, "--max_steps", "2"],
        [*stopped, "--max_steps", "4"]))
    assert sorted(whole) == [1, 2, 3, 4] and sorted(first) == [1, 2] and sorted(resumed) == [3, 4]
    for step, loss in resumed.items():
        assert loss == pytest.approx(whole[step], rel=1e-6, abs=1e-6), step
    qkv_rows = []
    for rank in (0, 1):  # each rank's adapter slices alone
        saved = torch.load(tmp_path / "resumed" / "checkpoints" / "2" / f"mp_rank_0{rank}_model_states.pt",
                           weights_only=True)
        assert "module" not in saved and saved["trained_part"] == "LoRA adapters"
        assert saved["trainable"] and all(".lora_A." in k or ".lora_B." in k for k in saved["trainable"])
        qkv_rows.append(next(v.shape[0] for k, v in saved["trainable"].items() if "query_key_value.lora_B" in k))
    final, again = (load_file(tmp_path / d / "final" / "adapter_model.safetensors") for d in ("whole", "resumed"))
    whole_rows = next(v.shape[0] for k, v in final.items() if k.endswith("query_key_value.lora_B.weight"))
    assert qkv_rows == [whole_rows // 2] * 2  # slices, not the whole adapter on each rank
    assert again.keys() == final.keys()
    for key, value in final.items():
        torch.testing.assert_close(again[key], value, rtol=1e-6, atol=1e-6, msg=key)


def test_tensor_parallel_lora_on_chatglm2_splits_its_query_and_key_value_groups(tmp_path, capsys):
    """ChatGLM2's query_key_value is [Q heads | K groups | V groups], each split over the ranks, and
    dense_h_to_4h [gate | up] (stride 2): TP 2 trains as one process does and saves the same whole adapter."""
    full = _tiny_chatglm2_finetune_argv(tmp_path)
    argv = [*full, "--lora", "--lora_target_modules", "query_key_value,dense_h_to_4h,dense_4h_to_h"]
    # A full finetune too (the vocab-parallel loss over this rank's slice of the replicated output layer),
    # its shards merged into one THUDM directory by --merge_tensor_parallel_path.
    logs = _run_ranks(tmp_path, [*argv, "--output_dir", str(tmp_path / "tp")],
                          [*full, "--output_dir", str(tmp_path / "tp_full"),
                           "--merge_tensor_parallel_path", str(tmp_path / "tp_merged")])
    _assert_one_process_run(tmp_path, capsys, logs, argv, full)
    assert "merged the tensor-parallel shards into" in logs[1]
    assert json.loads((tmp_path / "tp_merged" / "config.json").read_text())["model_type"] == "chatglm"
    assert sorted(p.name for p in (tmp_path / "tp_full" / "final" / "4").iterdir()) == [
        "mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"]
    # The merged directory, and the shard directory as saved (merged on loading), give one process's logits.
    _assert_one_process_logits(tmp_path, tmp_path / "tp_merged", tmp_path / "tp_full" / "final")


def test_tensor_parallel_4_on_chatglm2s_2_key_value_groups_trains_as_one_process(tmp_path, capsys):
    """TP 4 on the tiny ChatGLM2's 2 key/value groups: each group is held by 2 ranks (lora_B's rows for it
    too), their gradients summed over its ranks and counted once in the clipped norm, so LoRA and a full
    finetune log one process's losses, and the adapter saved is one process's whole adapter."""
    full = _tiny_chatglm2_finetune_argv(tmp_path, "--max_grad_norm", "0.05")  # a norm that clips every step
    argv = [*full, "--lora", "--lora_target_modules", "query_key_value"]
    logs = _run_ranks(tmp_path, [*argv, "--output_dir", str(tmp_path / "tp")],
                          [*full, "--output_dir", str(tmp_path / "tp_full")], world=4)
    _assert_one_process_run(tmp_path, capsys, logs, argv, full)
    # glm-merge puts the 4 shards (each key/value group held by 2 of them) back into one THUDM directory, which
    # loads with one process's logits, and which glm-convert turns into transformers' GlmForCausalLM.
    from transformers import AutoModelForCausalLM

    from glm_port.convert.merge import main as merge
    from glm_port.convert.native import main as convert

    merge([str(tmp_path / "tp_full" / "final"), str(tmp_path / "merged")])
    assert "(4 tensor-parallel shards)" in capsys.readouterr().out
    ids, single = _assert_one_process_logits(tmp_path, tmp_path / "merged")
    assert convert(["--to", "transformers", str(tmp_path / "merged"), str(tmp_path / "hf")]) == 0
    with torch.no_grad():
        hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
        torch.testing.assert_close(hf(ids).logits, single, rtol=1e-4, atol=1e-4)


def test_chatglm2_family_finetunes_through_the_same_command(tmp_path, capsys):
    """The family comes from the model: the embedded ChatGLM2 trains on ptuning/main.py's layout (the source
    through build_prompt, loss on the answer and its </s>) and saves a directory its loader reads back."""
    out = _run(["--model_name_or_path", "chatglm2-tiny", *QUICK, "--do_eval", "false", "--learning_rate", "1e-2",
                "--output_dir", str(tmp_path)], capsys)
    losses = _losses(out)
    assert sorted(losses) == list(range(1, 7)) and losses[6] < losses[1]
    from glm_port.models.chatglm2.finetune import encode
    from glm_port.models.chatglm2.weights import load_pretrained, load_tokenizer
    from glm_port.finetune.datasets import Pair

    assert load_pretrained(tmp_path / "final").config.model_type == "chatglm"
    tokenizer = load_tokenizer(tmp_path / "final")
    sample = encode(tokenizer, [Pair("红色连衣裙", "好看")], 64, 128)[0]
    prompt = tokenizer.encode(tokenizer.build_prompt("红色连衣裙"))
    answer = tokenizer.encode("好看", add_special_tokens=False)
    assert sample.text.tolist() == prompt + answer + [tokenizer.eos_token_id]
    counted = sample.target[sample.loss_mask == 1].tolist()
    assert counted == answer + [tokenizer.eos_token_id]  # each counted position predicts the next token


# ---- full finetunes of GLM directories, glm-pretrain checkpoints, position limits (issue 26) ---------------


def _glm_directory(path, max_sequence_length=64, **config):
    """A random GLM saved as a Hugging Face directory with its (built-in) tokenizer recorded."""
    from glm_port import GLMConfig, GLMForConditionalGeneration
    from glm_port.data import get_tokenizer
    from glm_port.models.glm.tokenizer import GLMTokenizer

    vocab = get_tokenizer()
    config = GLMConfig(vocab_size=vocab.vocab_size, num_layers=1, hidden_size=32, num_attention_heads=2,
                       max_sequence_length=max_sequence_length, **config)
    torch.manual_seed(0)
    GLMForConditionalGeneration(config).save_pretrained(path)
    GLMTokenizer(vocab).save_pretrained(path)
    return path


def _pairs_file(path, source_words=4, count=8):
    with open(path, "w", encoding="utf-8") as f:
        for i in range(count):
            words = [f"w{(i + k) % 7}" for k in range(source_words)]
            f.write(json.dumps({"source": " ".join(words), "target": " ".join(reversed(words[:4]))}) + "\n")
    return path


def test_a_glm_directory_full_finetunes_every_weight(tmp_path, capsys):
    """from_pretrained's weights are trainable: a full finetune of a GLM directory trains all of them (it
    used to print 'trainable parameters: 0' and die in the optimizer)."""
    from safetensors.torch import load_file

    base = _glm_directory(tmp_path / "base")
    out = _run(["--model_name_or_path", str(base), "--train_file", str(_pairs_file(tmp_path / "t.json")),
                "--do_train", "--max_steps", "3", "--logging_steps", "1", "--learning_rate", "1e-2",
                "--src_length", "16", "--tgt_length", "8", "--output_dir", str(tmp_path / "out")], capsys)
    total = re.search(r"trainable parameters: ([\d,]+) of ([\d,]+) \(100\.000%\)", out)
    assert total and total[1] == total[2], out
    losses = _losses(out)
    assert sorted(losses) == [1, 2, 3] and losses[3] != losses[1]
    before, after = load_file(base / "model.safetensors"), load_file(tmp_path / "out" / "final" / "model.safetensors")
    strip = lambda name: name.removeprefix("glm.")  # noqa: E731
    after = {strip(k): v for k, v in after.items()}
    moved = [k for k, v in before.items() if not torch.equal(v, after[strip(k)])]
    assert len(moved) == len(before), sorted(set(map(strip, before)) - set(map(strip, moved)))


def test_a_glm_directory_finetunes_at_tensor_parallel_2_as_one_process(tmp_path, capsys):
    """--tensor_parallel_degree 2 on a GLM directory: each rank reads its slices (it used to build the model
    split and read the whole weights into it: a WeightsError), full and LoRA train as one process does."""
    no_dropout = dict(embedding_dropout_prob=0.0, attention_dropout_prob=0.0, output_dropout_prob=0.0)
    base = _glm_directory(tmp_path / "base", **no_dropout)  # the ranks draw other dropout masks than one process
    full = [*TP_ARGV, "--model_name_or_path", str(base), "--do_train", "--train_file",
            str(_pairs_file(tmp_path / "t.json")), "--src_length", "16", "--tgt_length", "8"]
    lora = [*full, "--lora", "--lora_target_modules", "query_key_value,dense"]
    logs = _run_ranks(tmp_path, [*full, "--output_dir", str(tmp_path / "tp_full")],
                          [*lora, "--output_dir", str(tmp_path / "tp_lora")])
    for log, argv, name in zip(logs, (full, lora), ("one_full", "one_lora")):
        parallel, single = _losses(log), _losses(_run([*argv, "--output_dir", str(tmp_path / name)], capsys))
        assert sorted(parallel) == sorted(single) == [1, 2, 3, 4], log
        for step, loss in single.items():
            assert parallel[step] == pytest.approx(loss, rel=1e-4), (name, step)


def _pretrain(save, *extra):
    from glm_port.pretrain_glm import main as pretrain

    pretrain(["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "32",
              "--batch-size", "2", "--train-iters", "2", "--eval-iters", "0", "--save", str(save), *extra])


def _wordpiece_vocab(directory):
    vocab = directory / "tiny-cased-vocab.txt"
    vocab.parent.mkdir(exist_ok=True)
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *"abcdefghijklmnopqrstuvwxyz",
                                "the", "of", "and", "##s", "##ing", "W", "w0", "w1", "w2"]) + "\n")
    return vocab


def test_a_glm_pretrain_checkpoint_finetunes_with_the_tokenizer_it_recorded(tmp_path, capsys):
    """glm-pretrain --save records its tokenizer (type + a copy of the vocabulary), so the checkpoint
    finetunes alone, even once the vocabulary it was trained from is gone."""
    vocab = _wordpiece_vocab(tmp_path / "vocab")
    _pretrain(tmp_path / "ckpt", "--tokenizer-type", "BertWordPieceTokenizer", "--tokenizer-path", str(vocab))
    assert (tmp_path / "ckpt" / vocab.name).read_bytes() == vocab.read_bytes()
    from glm_port.data import get_tokenizer
    from glm_port.models.glm.tokenizer import GLMTokenizer

    trained_with = get_tokenizer("BertWordPieceTokenizer", vocab).fingerprint
    vocab.unlink()
    assert GLMTokenizer.from_pretrained(tmp_path / "ckpt").vocab.fingerprint == trained_with  # cased, as trained
    capsys.readouterr()
    out = _run(["--model_name_or_path", str(tmp_path / "ckpt"), "--train_file", str(_pairs_file(tmp_path / "t.json")),
                "--do_train", "--max_steps", "2", "--logging_steps", "1", "--src_length", "16", "--tgt_length", "8",
                "--output_dir", str(tmp_path / "out")], capsys)
    assert sorted(_losses(out)) == [1, 2] and "trainable parameters: 0 " not in out
    assert GLMTokenizer.from_pretrained(tmp_path / "out" / "final").vocab.fingerprint == trained_with


def test_a_checkpoint_without_a_tokenizer_names_the_flag_and_takes_one(tmp_path, capsys):
    """A checkpoint with no tokenizer recorded: one line naming --tokenizer_name_or_path; with it (a vocabulary
    file) the run trains and its model directory records that vocabulary."""
    from glm_port.data import get_tokenizer
    from glm_port.models.glm.tokenizer import GLMTokenizer

    vocab = _wordpiece_vocab(tmp_path / "vocab")
    _pretrain(tmp_path / "ckpt", "--tokenizer-type", "BertWordPieceTokenizer", "--tokenizer-path", str(vocab))
    for name in ("tokenizer_config.json", vocab.name):  # as glm-pretrain wrote checkpoints before
        (tmp_path / "ckpt" / name).unlink()
    argv = ["--model_name_or_path", str(tmp_path / "ckpt"), "--train_file", str(_pairs_file(tmp_path / "t.json")),
            "--do_train", "--max_steps", "1", "--logging_steps", "1", "--src_length", "16", "--tgt_length", "8"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--output_dir", str(tmp_path / "a")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no GLM vocabulary in" in err[0] and "--tokenizer_name_or_path" in err[0], err
    out = _run([*argv, "--tokenizer_name", str(vocab), "--output_dir", str(tmp_path / "b")], capsys)
    assert sorted(_losses(out)) == [1]
    final = tmp_path / "b" / "final"
    assert (final / vocab.name).read_bytes() == vocab.read_bytes()
    assert GLMTokenizer.from_pretrained(final).vocab.fingerprint == get_tokenizer("BertWordPieceTokenizer",
                                                                                  vocab).fingerprint


def test_lengths_beyond_the_models_positions_are_cut_before_the_data_is_read(tmp_path, capsys):
    """A 400-word sample with the default --src_length 608 on a 32-position GLM: one line says the lengths
    were cut to the positions; training, evaluation and prediction run (it died midway in an IndexError)."""
    base = _glm_directory(tmp_path / "base", max_sequence_length=32)
    data = str(_pairs_file(tmp_path / "t.json", source_words=400, count=4))
    out = _run(["--model_name_or_path", str(base), "--train_file", data, "--eval_file", data, "--test_file", data,
                "--do_train", "--do_eval", "--do_predict", "--max_steps", "1", "--logging_steps", "1",
                "--per_device_train_batch_size", "4",
                "--tgt_length", "200", "--output_dir", str(tmp_path / "out")], capsys)
    assert (" > --src_length 608 / --tgt_length 200 exceed the model's positions: sources cut to 32 tokens, "
            "targets to 32\n") in out
    assert sorted(_losses(out)) == [1] and (tmp_path / "out" / "test_predictions.jsonl").is_file()


def test_chatglm2_lengths_fit_its_seq_length():
    from types import SimpleNamespace

    from glm_port.models.chatglm2.finetune import fit_lengths

    model = SimpleNamespace(config=SimpleNamespace(seq_length=512))
    assert fit_lengths(model, 64, 128) == (64, 128)
    assert fit_lengths(model, 608, 160) == (351, 160)  # 351 + 160 + 1 = 512: a training sample fits
    assert fit_lengths(model, 64, 600) == (64, 447)


def test_help_shows_every_flags_default():
    from glm_port.finetune.arguments import build_parser

    text = build_parser().format_help()
    options = text.split("\noptions:\n", 1)[1]
    blocks = re.split(r"\n(?=  --)", options)  # one block per flag: its names, then its help
    flags = [b for b in blocks if b.startswith("  --") and not b.startswith("  --help")]
    assert len(flags) > 50
    for block in flags:
        assert "default" in " ".join(block.split()), block
    assert "--learning_rate LEARNING_RATE peak AdamW learning rate (the embedded run: 2e-3) (default: 5e-05)" in \
        " ".join(text.split())


def test_an_embedded_model_without_data_says_so(tmp_path, capsys, monkeypatch):
    """--model_name_or_path chatglm2-tiny alone runs the embedded task; the line says a model was named."""
    import glm_port.finetune.run as run

    monkeypatch.setattr(run, "_check_inputs", lambda args: (_ for _ in ()).throw(run.FinetuneError("stop here")))
    with pytest.raises(SystemExit):
        main(["--model_name_or_path", "chatglm2-tiny", "--output_dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "no model or data given" not in out
    assert "glm-finetune: no data given (--train_file, --eval_file, --test_file)" in out
    assert "chatglm2-tiny (random weights) learns the embedded task" in out


def test_evaluation_search_flags_reach_generate(tmp_path, generate_calls, capsys):
    """--length_penalty, --num_beams, --no_repeat_ngram_size, --min_tgt_length (and with --select_topk:
    --top_k/--top_p/--temperature) arrive in generate's arguments during evaluation and prediction."""
    calls = generate_calls
    base = _glm_directory(tmp_path / "base")
    data = str(_pairs_file(tmp_path / "t.json", count=3))
    common = ["--model_name_or_path", str(base), "--eval_file", data, "--test_file", data, "--do_eval",
              "--do_predict", "--src_length", "16", "--tgt_length", "5"]
    _run([*common, "--num_beams", "3", "--length_penalty", "0.37", "--no_repeat_ngram_size", "2",
          "--min_tgt_length", "1", "--output_dir", str(tmp_path / "a")], capsys)
    assert len(calls) == 2 and all(c.get("length_penalty") == 0.37 and c.get("num_beams") == 3 and
                                   c.get("no_repeat_ngram_size") == 2 and c.get("min_new_tokens") == 1 and
                                   c.get("max_new_tokens") == 5 for c in calls), calls
    calls.clear()
    _run([*common, "--select_topk", "--top_k", "7", "--top_p", "0.61", "--temperature", "0.83",
          "--output_dir", str(tmp_path / "b")], capsys)
    assert len(calls) == 2 and all(c.get("do_sample") is True and c.get("top_k") == 7 and c.get("top_p") == 0.61
                                   and c.get("temperature") == 0.83 for c in calls), calls


def test_glm_pretrain_records_the_casing_its_model_type_chose(tmp_path):
    """--tokenizer-model-type bert-base-chinese keeps case (upstream's rule) though the file's name has no
    '-cased': the checkpoint's tokenizer_config.json says do_lower_case false, and reading it back keeps case."""
    from glm_port.data import get_tokenizer
    from glm_port.models.glm.tokenizer import GLMTokenizer

    vocab = _wordpiece_vocab(tmp_path / "vocab").rename(tmp_path / "vocab" / "bert-base-chinese-vocab.txt")
    _pretrain(tmp_path / "ckpt", "--tokenizer-type", "BertWordPieceTokenizer", "--tokenizer-path",
              str(vocab.parent), "--tokenizer-model-type", "bert-base-chinese")
    assert json.loads((tmp_path / "ckpt" / "tokenizer_config.json").read_text())["do_lower_case"] is False
    cased = get_tokenizer("BertWordPieceTokenizer", vocab, lowercase=False)
    read = GLMTokenizer.from_pretrained(tmp_path / "ckpt").vocab
    assert read.fingerprint == cased.fingerprint
    assert read.encode("W") == cased.encode("W") != get_tokenizer("BertWordPieceTokenizer", vocab).encode("W")


def test_an_iteration_of_a_pretrain_checkpoint_finds_the_tokenizer_beside_its_tracker(tmp_path, capsys):
    """--model_name_or_path SAVE/2 (or its rank file) reads the tokenizer SAVE records beside the tracker."""
    vocab = _wordpiece_vocab(tmp_path / "vocab")
    _pretrain(tmp_path / "ckpt", "--tokenizer-type", "BertWordPieceTokenizer", "--tokenizer-path", str(vocab))
    data = str(_pairs_file(tmp_path / "t.json"))
    for index, model in enumerate((tmp_path / "ckpt" / "2", tmp_path / "ckpt" / "2" / "mp_rank_00_model_states.pt")):
        out = _run(["--model_name_or_path", str(model), "--train_file", data, "--do_train", "--max_steps", "1",
                    "--logging_steps", "1", "--src_length", "16", "--tgt_length", "8",
                    "--output_dir", str(tmp_path / f"out{index}")], capsys)
        assert sorted(_losses(out)) == [1], out
        assert (tmp_path / f"out{index}" / "final" / vocab.name).read_bytes() == vocab.read_bytes()


def test_a_chatglm2_directory_without_its_tokenizer_names_the_flag_and_takes_one(tmp_path, capsys):
    from glm_port.finetune.toy_task import write_toy_task
    from glm_port.models.chatglm2.finetune import save
    from glm_port.models.chatglm2.tiny import build_tiny

    (tmp_path / "tokenizer").mkdir()
    save(*build_tiny(str(tmp_path / "tokenizer")), tmp_path / "base")
    (tmp_path / "base" / "tokenizer.model").rename(tmp_path / "tokenizer.model")
    argv = ["--model_name_or_path", str(tmp_path / "base"), "--do_train", "--train_file",
            str(write_toy_task(tmp_path / "data")[0]), "--src_length", "12", "--tgt_length", "10", "--max_steps", "1",
            "--logging_steps", "1", "--do_eval", "false"]
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--output_dir", str(tmp_path / "a")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no ChatGLM2 tokenizer in" in err[0] and "--tokenizer_name_or_path" in err[0], err
    out = _run([*argv, "--tokenizer_name_or_path", str(tmp_path / "tokenizer.model"),
                "--output_dir", str(tmp_path / "b")], capsys)
    assert sorted(_losses(out)) == [1] and (tmp_path / "b" / "final" / "tokenizer.model").is_file()


def _bf16_chatglm2(tmp_path):
    """The embedded tiny ChatGLM2 saved with its weights in bf16 (as THUDM's checkpoints hold them)."""
    from glm_port.models.chatglm2.finetune import save
    from glm_port.models.chatglm2.tiny import build_tiny

    (tmp_path / "tokenizer").mkdir(exist_ok=True)
    model, tokenizer = build_tiny(str(tmp_path / "tokenizer"))
    save(model.to(torch.bfloat16), tokenizer, tmp_path / "bf16")
    return tmp_path / "bf16"


def _train_in_process(tmp_path, name, *extra):
    """glm-finetune's setup and training in this process: ``(session, log)``, the session's model as trained."""
    from glm_port.finetune.arguments import parse_args
    from glm_port.finetune.run import _cached_encoding, setup, train
    from glm_port.finetune.toy_task import write_toy_task

    train_file = tmp_path / "data" / "train.json"
    if not train_file.is_file():
        train_file = write_toy_task(tmp_path / "data")[0]
    args = parse_args(["--do_train", "--train_file", str(train_file), "--src_length", "12", "--tgt_length", "10",
                       "--per_device_train_batch_size", "16", "--logging_steps", "1", "--device", "cpu",
                       "--output_dir", str(tmp_path / name), *extra])
    session = setup(args)
    session.output_dir.mkdir(parents=True)
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        train(args, session, _cached_encoding(args, session, args.train_file), None)
    session.env.close()
    return session, buffer.getvalue()


def test_a_bf16_checkpoint_trains_fp32_master_weights_that_take_updates_below_bf16s_resolution(tmp_path,
                                                                                                  monkeypatch):
    """A bf16 checkpoint loaded in bf16 (as ChatGLM2's loader does on an accelerator), --bf16, AdamW at lr 1e-6
    (each step moves a weight by about 1e-6, far below bf16's resolution at the weights' size): the weights are
    trained in fp32 (master copy) and move; held in bf16 (as before) every update rounded away and the weights
    stayed as loaded."""
    from glm_port.models.chatglm2 import weights

    monkeypatch.setattr(weights, "default_dtype", lambda device: torch.bfloat16)
    base = _bf16_chatglm2(tmp_path)
    loaded = weights.load_pretrained(base).state_dict()
    assert loaded["transformer.encoder.layers.0.self_attention.query_key_value.weight"].dtype == torch.bfloat16
    session, _ = _train_in_process(tmp_path, "out", "--model_name_or_path", str(base), "--bf16",
                                   "--learning_rate", "1e-6", "--max_steps", "3", "--max_grad_norm", "0")
    weights = dict(session.base.named_parameters())
    assert {p.dtype for p in weights.values()} == {torch.float32}
    name = "transformer.encoder.layers.0.self_attention.query_key_value.weight"
    master, start = weights[name].detach(), loaded[name].float()
    assert (master != start).float().mean() > 0.99  # the master weights took (nearly) every update,
    # most of which are below bf16's step: held in bf16, those weights would not have moved at all
    assert (master.to(torch.bfloat16).float() != start).float().mean() < 0.5
    moved = (master - start).abs().max().item()
    assert 1e-7 < moved < 1e-4


def test_a_bf16_run_tracks_fp32_and_saves_the_checkpoints_dtype(tmp_path):
    """The same finetune from the bf16 checkpoint with --bf16 and in fp32 (the weights cast to fp32 first): the
    losses agree within bf16's tolerance; the bf16 run's final model is written in bf16, as it was read."""
    from safetensors.torch import load_file

    from glm_port.finetune.run import save_model

    base = _bf16_chatglm2(tmp_path)
    steps = ["--model_name_or_path", str(base), "--learning_rate", "2e-3", "--max_steps", "5"]
    session, half = _train_in_process(tmp_path, "run_bf16", *steps, "--bf16")
    _, full = _train_in_process(tmp_path, "run_fp32", *steps)
    half, full = _losses(half), _losses(full)
    assert sorted(half) == sorted(full) == [1, 2, 3, 4, 5]
    assert full[5] < full[1] and half[5] < half[1]
    for step in full:
        assert half[step] == pytest.approx(full[step], rel=2e-2), (step, half, full)
    save_model(argparse.Namespace(merge_lora=False), session, tmp_path / "final", 5)
    saved = load_file(tmp_path / "final" / "model.safetensors")
    assert {v.dtype for v in saved.values() if v.is_floating_point()} == {torch.bfloat16}
    assert json.loads((tmp_path / "final" / "config.json").read_text())["dtype"] == "bfloat16"
    assert {p.dtype for p in session.base.parameters()} == {torch.float32}  # the masters put back after saving


def test_a_bf16_glm_directory_trains_fp32_masters_and_is_saved_in_bf16(tmp_path):
    """GLM's from_pretrained gives a bf16 directory's weights in bf16: a full finetune trains fp32 masters of
    them (AdamW at lr 1e-6 moves every weight of a layer, below bf16's resolution) and writes bf16 again."""
    from safetensors.torch import load_file

    from glm_port import GLMForConditionalGeneration
    from glm_port.finetune.arguments import parse_args
    from glm_port.finetune.run import save_model, setup, train
    from glm_port.finetune.datasets import read_pairs

    base = _glm_directory(tmp_path / "fp32")
    GLMForConditionalGeneration.from_pretrained(base).to(torch.bfloat16).save_pretrained(tmp_path / "bf16")
    for name in ("tokenizer_config.json", "vocab.txt", "vocab.json", "merges.txt"):
        if (base / name).is_file():
            (tmp_path / "bf16" / name).write_bytes((base / name).read_bytes())
    data = _pairs_file(tmp_path / "t.json")
    args = parse_args(["--model_name_or_path", str(tmp_path / "bf16"), "--do_train", "--train_file", str(data),
                       "--bf16", "--learning_rate", "1e-6", "--max_steps", "3", "--max_grad_norm", "0",
                       "--src_length", "16", "--tgt_length", "8", "--device", "cpu", "--output_dir", str(tmp_path / "out")])
    session = setup(args)
    loaded = {k: v.clone() for k, v in load_file(tmp_path / "bf16" / "model.safetensors").items()}
    session.output_dir.mkdir()
    with contextlib.redirect_stdout(io.StringIO()):
        train(args, session, session.binding.encode(session.tokenizer, read_pairs(data), 16, 8), None)
    weights = {k: v.detach() for k, v in session.base.state_dict().items()}
    assert {v.dtype for v in weights.values() if v.is_floating_point()} == {torch.float32}
    name = next(k for k in weights if k.endswith("dense_h_to_4h.weight"))
    start = loaded[next(k for k in loaded if k.endswith(name))].float()
    assert (weights[name] != start).float().mean() > 0.99
    assert (weights[name].to(torch.bfloat16).float() != start).float().mean() < 0.5
    save_model(argparse.Namespace(merge_lora=False), session, tmp_path / "final", 3)
    session.env.close()
    saved = load_file(tmp_path / "final" / "model.safetensors")
    assert {v.dtype for v in saved.values() if v.is_floating_point()} == {torch.bfloat16}


def test_an_fp32_checkpoint_loaded_in_bf16_is_saved_in_fp32(tmp_path, monkeypatch):
    """ChatGLM2's loader gives bf16 on an accelerator whatever the files hold: an fp32 checkpoint is still
    trained in fp32 and written in fp32, the dtype its config.json records."""
    from safetensors.torch import load_file

    from glm_port.finetune.run import save_model
    from glm_port.models.chatglm2 import weights
    from glm_port.models.chatglm2.finetune import save
    from glm_port.models.chatglm2.tiny import build_tiny

    (tmp_path / "tokenizer").mkdir()
    save(*build_tiny(str(tmp_path / "tokenizer")), tmp_path / "fp32")
    monkeypatch.setattr(weights, "default_dtype", lambda device: torch.bfloat16)
    session, _ = _train_in_process(tmp_path, "out", "--model_name_or_path", str(tmp_path / "fp32"), "--bf16",
                                   "--max_steps", "1")
    assert {p.dtype for p in session.base.parameters()} == {torch.float32}
    save_model(argparse.Namespace(merge_lora=False), session, tmp_path / "final", 1)
    saved = load_file(tmp_path / "final" / "model.safetensors")
    assert {v.dtype for v in saved.values() if v.is_floating_point()} == {torch.float32}
