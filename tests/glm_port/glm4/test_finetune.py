"""glm-finetune on GLM-4 (the family's ``finetune`` binding): samples in THUDM's GLM-4 finetune_demo layout
(``[gMASK]<sop><|user|>\\n{prompt}<|assistant|>\\n{response}<|user|>``, loss on what follows ``<|assistant|>``),
full and LoRA finetunes of a tiny GLM-4 directory made here, whose results glm-generate's and glm-chat's
bindings load, ``--recompute`` (the numbers of the plain forward) and the embedded ``glm4-tiny``."""

from __future__ import annotations

import json
import re

import pytest
import torch

from glm_port.finetune.datasets import Pair
from glm_port.finetune.run import main as finetune_main
from glm_port.models import FAMILIES, family_at
from glm_port.models.glm4.finetune import IGNORE_INDEX, conversation_example, encode, load, train_example

torch.set_num_threads(1)
LOSS = re.compile(r"^ iteration +(\d+)/ +\d+ \| .* \| lm loss (\S+) \|$", re.MULTILINE)  # glm-finetune's log


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from glm_port.models.glm4.tiny import build_tiny

    return build_tiny(str(tmp_path_factory.mktemp("glm4-tok")))


@pytest.fixture(scope="module")
def bases(tiny, tmp_path_factory):
    """The tiny GLM-4 written in THUDM's layout and in transformers' ``glm`` layout."""
    from glm_port.models.glm4.tiny import write_directory

    root = tmp_path_factory.mktemp("glm4-base")
    return {layout: write_directory(*tiny, root / layout, layout) for layout in ("thudm", "transformers")}


@pytest.fixture(scope="module")
def base(bases):
    return bases["thudm"]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Small pairs made here: a phrase and its words reversed."""
    phrases = ["the cat sat on the mat", "we walk in the park", "the day is good", "you have a question",
               "the time of the year", "a house and a tree", "the world was new", "he said it was late"]
    path = tmp_path_factory.mktemp("glm4-data") / "train.json"
    path.write_text("".join(json.dumps({"source": p, "target": " ".join(p.split()[::-1])}) + "\n"
                            for p in phrases), encoding="utf-8")
    return path


def test_a_sample_is_the_chat_prompt_then_the_response_counting_only_the_response(tiny):
    _, tok = tiny
    built = train_example(tok, "红色连衣裙 dress", "很好看, nice")
    prompt = tok.build_chat_input("红色连衣裙 dress")["input_ids"][0].tolist()  # what glm-chat feeds the model
    assert prompt == tok.apply_chat_template([{"role": "user", "content": "红色连衣裙 dress"}],
                                             add_generation_prompt=True, tokenize=True, return_dict=False)
    command = tok.get_command
    assert prompt[:3] == [command("[gMASK]"), command("<sop>"), command("<|user|>")]
    assert prompt[-1] == command("<|assistant|>")
    answer = tok.encode_text("\n") + tok.encode_text("很好看, nice") + [command("<|user|>")]  # finetune_demo's end
    assert built["input_ids"] == prompt + answer
    assert built["labels"] == [IGNORE_INDEX] * len(prompt) + answer
    cut = train_example(tok, "红色连衣裙 dress", "很好看, nice", max_source_length=len(prompt), max_target_length=1)
    assert cut["input_ids"] == built["input_ids"][:len(prompt) + 2]  # the whole sequence cut to src + tgt + 1


def test_encoded_samples_put_the_loss_on_the_response_and_generate_from_chats_prompt(tiny):
    _, tok = tiny
    train, = encode(tok, [Pair("红色连衣裙", "很好看")], 64, 128)
    prompt = tok.build_chat_input("红色连衣裙")["input_ids"][0].tolist()
    assert train.text[:train.sep].tolist() == prompt
    counted = train.target[train.loss_mask == 1].tolist()  # each counted position predicts the next token
    assert counted == tok.encode_text("\n") + tok.encode_text("很好看") + [tok.get_command("<|user|>")]
    assert train.loss_mask[:len(prompt) - 1].sum() == 0 and not train.truncated_target
    short, = encode(tok, [Pair("红色连衣裙", "很好看" * 20)], 8, 4)
    assert short.truncated_target and len(short.text) == 8 + 4 + 1
    generate_from, = encode(tok, [Pair("红色连衣裙", "很好看")], 64, 128, with_targets=False)
    assert generate_from.text.tolist() == prompt and generate_from.sep == len(prompt)


def test_a_conversation_counts_every_assistant_turn_and_no_other(tiny):
    _, tok = tiny
    tools = [{"name": "get_weather", "description": "weather", "parameters": {"type": "object", "properties": {}}}]
    messages = [{"role": "system", "content": "You help.", "tools": tools},
                {"role": "user", "content": "天气?"},
                {"role": "assistant", "metadata": "get_weather", "content": '{"city": "北京"}'},
                {"role": "observation", "content": "sunny"},
                {"role": "assistant", "content": "It is sunny."}]
    built = conversation_example(tok, messages, 512, 512)
    whole = tok.apply_chat_template([{**m, "tools": [{"type": "function", "function": t} for t in tools]}
                                     if "tools" in m else m for m in messages], tokenize=True, return_dict=False)
    assert built["input_ids"] == list(whole) + [tok.get_command("<|user|>")]
    command = tok.get_command
    call = tok.encode_text("get_weather\n") + tok.encode_text('{"city": "北京"}') + [command("<|observation|>")]
    reply = tok.encode_text("\n") + tok.encode_text("It is sunny.") + [command("<|user|>")]
    assert [label for label in built["labels"] if label != IGNORE_INDEX] == call + reply
    sample, = encode(tok, [Pair("", "", messages=messages)], 512, 512)
    assert sample.text[sample.sep - 1] == command("<|assistant|>")  # the prompt of the last reply
    assert sample.target[sample.sep - 1:].tolist()[:len(reply)] == reply


def test_glm4s_conversations_and_chatglm3s_are_built_by_one_function(tiny):
    """Duplicates D8: GLM-4's samples and prompts are ChatGLM3's builder (``chatglm2.finetune.role_conversation``,
    ``role_prompt``) with GLM-4's prefix, messages and closing token, not a copy of it."""
    from glm_port.models.chatglm2.finetune import role_conversation, role_prompt
    from glm_port.models.glm4.finetune import message_ids, prompt_ids

    _, tok = tiny
    messages = [{"role": "user", "content": "the cat"}, {"role": "assistant", "content": "cat the"},
                {"role": "user", "content": "a day"}, {"role": "assistant", "content": "day a"}]
    prefix = [tok.get_command("[gMASK]"), tok.get_command("<sop>")]

    def encode_message(message):
        return message_ids(tok, message)

    assert conversation_example(tok, messages, 64, 8) == role_conversation(
        messages, prefix, encode_message, tok.get_command("<|user|>"), 64, 8)
    assert prompt_ids(tok, messages[:3], 64) == role_prompt(messages[:3], prefix, encode_message,
                                                            tok.get_command("<|assistant|>"), 64)
    # the shared builder: any prefix, the tokens after an assistant's counted, the end closing it
    turns = [{"role": "user"}, {"role": "assistant"}]
    built = role_conversation(turns, [1, 2, 3], lambda m: [10, 11] if m["role"] == "user" else [20, 21], 99, 4, 4)
    assert built == {"input_ids": [1, 2, 3, 10, 11, 20, 21, 99], "labels": [IGNORE_INDEX] * 6 + [21, 99]}
    assert role_prompt(turns[:1], [1, 2], lambda m: [10, 11, 12], 50, 4) == [1, 2, 10, 11, 50]


def _losses(out: str) -> dict[int, float]:
    return {int(m[1]): float(m[2]) for m in LOSS.finditer(out)}


@pytest.mark.parametrize("layout", ["thudm", "transformers"])
def test_a_full_finetune_with_recompute_lowers_the_loss_and_saves_a_directory_glm_4s_bindings_load(
        bases, layout, data, tmp_path, capsys):
    base = bases[layout]
    finetune_main(["--model_name_or_path", base, "--do_train", "--train_file", str(data), "--max_steps", "8",
                   "--logging_steps", "1", "--learning_rate", "1e-2", "--per_device_train_batch_size", "4",
                   "--src_length", "24", "--tgt_length", "16", "--recompute", "--output_dir", str(tmp_path / "out")])
    losses = _losses(capsys.readouterr().out)
    assert sorted(losses) == list(range(1, 9)) and losses[8] < losses[1] - 0.5, losses
    final = tmp_path / "out" / "final"
    assert family_at(final).name == "glm4"
    model, tok = FAMILIES["glm4"].binding("generation").load(final)  # glm-generate's route
    before, _ = FAMILIES["glm4"].binding("generation").load(bases["thudm"])  # the same weights in either layout
    assert type(model).__name__ == "GLM4ForCausalLM" and model.config.rope_ratio == 500
    changed = [n for n, p in model.state_dict().items() if not torch.equal(p, before.state_dict()[n])]
    assert "transformer.output_layer.weight" in changed and len(changed) == len(before.state_dict())
    chat_model, chat_tok = FAMILIES["glm4"].binding("conversation").load(final)  # glm-chat's route
    reply, _ = chat_model.chat(chat_tok, "the day is good", max_new_tokens=4, do_sample=False)
    assert isinstance(reply, (str, dict))


def test_a_lora_finetune_trains_the_adapters_alone_and_merges_into_a_glm_4_directory(base, data, tmp_path, capsys):
    out = tmp_path / "out"
    finetune_main(["--model_name_or_path", base, "--do_train", "--train_file", str(data), "--max_steps", "8",
                   "--logging_steps", "1", "--learning_rate", "2e-2", "--per_device_train_batch_size", "4",
                   "--src_length", "24", "--tgt_length", "16", "--lora", "--r", "8", "--lora_alpha", "32",
                   "--merge_lora", "--output_dir", str(out)])
    printed = capsys.readouterr().out
    losses = _losses(printed)
    assert sorted(losses) == list(range(1, 9)) and losses[8] < losses[1], losses
    trainable = re.search(r"trainable parameters: ([\d,]+) of ([\d,]+)", printed)
    assert 0 < int(trainable[1].replace(",", "")) < int(trainable[2].replace(",", "")) / 4
    model, _ = FAMILIES["glm4"].binding("generation").load(out / "final")
    before, _ = FAMILIES["glm4"].binding("generation").load(base)
    changed = {n for n, p in model.state_dict().items() if not torch.equal(p, before.state_dict()[n])}
    assert changed and all("query_key_value.weight" in n for n in changed), changed  # only the adapted linears


def test_a_lora_adapter_is_saved_alone_and_applies_to_the_base(base, data, tmp_path, capsys):
    out = tmp_path / "out"
    finetune_main(["--model_name_or_path", base, "--do_train", "--train_file", str(data), "--max_steps", "2",
                   "--src_length", "24", "--tgt_length", "16", "--lora", "--output_dir", str(out)])
    assert (out / "final" / "adapter_config.json").is_file() and not (out / "final" / "config.json").exists()
    finetune_main(["--model_name_or_path", base, "--lora_path", str(out / "final"), "--do_predict", "--test_file",
                   str(data), "--tgt_length", "3", "--num_beams", "1", "--output_dir", str(tmp_path / "predict")])
    assert len((tmp_path / "predict" / "test_predictions.jsonl").read_text().splitlines()) == 8


def test_a_conversations_file_finetunes(base, tmp_path, capsys):
    conversation = {"conversations": [{"role": "system", "content": "You help."},
                                      {"role": "user", "content": "the cat sat"},
                                      {"role": "assistant", "content": "sat cat the"},
                                      {"role": "user", "content": "the day is good"},
                                      {"role": "assistant", "content": "good is day the"}]}
    path = tmp_path / "chats.json"
    path.write_text(json.dumps(conversation) + "\n", encoding="utf-8")
    finetune_main(["--model_name_or_path", base, "--dataset_layout", "conversations", "--do_train", "--train_file",
                   str(path), "--max_steps", "4", "--logging_steps", "1", "--learning_rate", "1e-2",
                   "--src_length", "48", "--tgt_length", "16", "--output_dir", str(tmp_path / "out")])
    losses = _losses(capsys.readouterr().out)
    assert sorted(losses) == [1, 2, 3, 4] and losses[4] < losses[1]


def test_recompute_gives_the_loss_and_gradients_of_the_plain_forward(base):
    plain, tok = load(base, "cpu")
    checkpointed, _ = load(base, "cpu", recompute=True)
    assert checkpointed.transformer.encoder.gradient_checkpointing and not plain.transformer.encoder.gradient_checkpointing
    ids = torch.tensor([train_example(tok, "the cat sat", "sat cat the")["input_ids"]])
    results = []
    for model in (plain, checkpointed):
        model.train()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        results.append((loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss, grads), (loss_r, grads_r) = results
    torch.testing.assert_close(loss_r, loss, rtol=0, atol=0)
    for name, grad in grads.items():
        torch.testing.assert_close(grads_r[name], grad, rtol=1e-6, atol=1e-7, msg=name)


def test_the_embedded_glm4_tiny_finetunes(data, tmp_path, capsys):
    finetune_main(["--model_name_or_path", "glm4-tiny", "--do_train", "--train_file", str(data), "--max_steps", "3",
                   "--logging_steps", "1", "--src_length", "24", "--tgt_length", "16",
                   "--output_dir", str(tmp_path / "out")])
    assert sorted(_losses(capsys.readouterr().out)) == [1, 2, 3]
    assert family_at(tmp_path / "out" / "final").name == "glm4"


@pytest.mark.parametrize("flags, message", [
    (["--pre_seq_len", "4", "--tensor_parallel_degree", "2"],
     "--pre_seq_len 4 with --tensor_parallel_degree 2: a P-Tuning prefix is not split by tensor parallelism"),
    (["--pre_seq_len", "4", "--lora"], "--pre_seq_len 4 with --lora: P-Tuning and LoRA exclude each other"),
])
def test_what_glm4_does_not_finetune_is_refused_in_one_line(base, tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as stop:
        finetune_main(["--model_name_or_path", base, "--do_train", "--train_file", "x.json",
                       "--output_dir", str(tmp_path / "out"), *flags])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"glm-finetune: error: {message}"), err
    assert not (tmp_path / "out").exists()


def _torchrun_finetune(argv, ranks: int = 2):
    """glm-finetune under torchrun (gloo, a clean interpreter a rank), as a user launches it; its stdout."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks), "-m",
         "glm_port.finetune", *argv], capture_output=True, text=True, timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[3])})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _as_one_process(argv, tmp_path, capsys, *parallel_only) -> dict[int, float]:
    """glm-finetune ``argv`` at --tensor_parallel_degree 2 under torchrun (into ``tmp_path/tp``, with
    ``parallel_only`` flags) and in this process (``tmp_path/one``): the same 4 steps, one process's losses (1e-4).
    Returns the one process's losses."""
    log = _torchrun_finetune([*argv, "--tensor_parallel_degree", "2", "--output_dir", str(tmp_path / "tp"),
                              *parallel_only])
    finetune_main([*argv, "--output_dir", str(tmp_path / "one")])
    parallel, single = _losses(log), _losses(capsys.readouterr().out)
    assert sorted(parallel) == sorted(single) == [1, 2, 3, 4]
    for step, loss in single.items():
        assert parallel[step] == pytest.approx(loss, rel=1e-4), step
    return single


def test_tensor_parallel_2_finetunes_glm4_as_one_process_and_its_shards_merge(base, data, tmp_path, capsys):
    """--tensor_parallel_degree 2 on a GLM-4 directory (it used to be refused by the binding): each rank reads its
    slices (ChatGLM2's split plan on GLM-4's 2 key/value groups), the losses are one process's (1e-4), the shards
    saved are GLM-4's (``family_at``), load as they are and, merged by --merge_tensor_parallel_path, give the logits
    of the model one process saved."""
    argv = ["--model_name_or_path", base, "--do_train", "--train_file", str(data), "--do_eval", "false",
            "--max_steps", "4", "--logging_steps", "1", "--learning_rate", "1e-2", "--per_device_train_batch_size",
            "8", "--src_length", "24", "--tgt_length", "16"]
    single = _as_one_process(argv, tmp_path, capsys, "--merge_tensor_parallel_path", str(tmp_path / "merged"))
    assert single[4] < single[1]  # it trained
    assert sorted(p.name for p in (tmp_path / "tp" / "final" / "4").iterdir()) == [
        "mp_rank_00_model_states.pt", "mp_rank_01_model_states.pt"]
    generation = FAMILIES["glm4"].binding("generation")
    ids = torch.tensor([[3, 17, 250, 9, 511, 40, 961, 7], [88, 300, 2, 64, 5, 6, 7, 8]])
    with torch.no_grad():
        expected = generation.load(tmp_path / "one" / "final")[0](ids).logits
        for directory in (tmp_path / "merged", tmp_path / "tp" / "final"):
            assert family_at(directory).name == "glm4", directory
            torch.testing.assert_close(generation.load(directory)[0](ids).logits, expected, rtol=1e-4, atol=1e-4,
                                       msg=str(directory))


def test_tensor_parallel_2_finetunes_the_embedded_glm4_tiny_as_one_process(data, tmp_path, capsys):
    """--model_name_or_path glm4-tiny at --tensor_parallel_degree 2: each rank holds its slices of the one model a
    single process builds (it used to build each rank's shards at random, so the losses were another model's), the
    losses are one process's (1e-4), and the shards saved load to the logits of the model one process saved. The
    shards' config names GLM4ForCausalLM, so they are GLM-4's with no tokenizer beside them (the tiny vocabulary is
    not GLM-4's 151552: they used to be taken for ChatGLM2's)."""
    import shutil

    argv = ["--model_name_or_path", "glm4-tiny", "--do_train", "--train_file", str(data), "--do_eval", "false",
            "--max_steps", "4", "--logging_steps", "1", "--learning_rate", "1e-2", "--per_device_train_batch_size",
            "8", "--src_length", "24", "--tgt_length", "16"]
    _as_one_process(argv, tmp_path, capsys)
    generation = FAMILIES["glm4"].binding("generation")
    ids = torch.tensor([[3, 17, 250, 9, 511, 40, 961, 7]])
    with torch.no_grad():
        expected = generation.load(tmp_path / "one" / "final")[0](ids).logits
        torch.testing.assert_close(generation.load(tmp_path / "tp" / "final")[0](ids).logits, expected, rtol=1e-4,
                                   atol=1e-4)
    alone = tmp_path / "alone"
    shutil.copytree(tmp_path / "tp" / "final" / "4", alone / "4")
    (alone / "latest_checkpointed_iteration.txt").write_text("4")
    assert not list(alone.glob("tokenizer*"))
    for path in (alone, alone / "4", alone / "4" / "mp_rank_00_model_states.pt"):
        assert family_at(path).name == "glm4", path


def test_tensor_parallel_2_lora_on_glm4_trains_as_one_process_and_saves_the_whole_adapter(base, data, tmp_path,
                                                                                           capsys):
    """LoRA on GLM-4's split query_key_value ([Q heads | K groups | V groups]), dense_h_to_4h ([gate | up]) and
    dense_4h_to_h at tensor parallel 2: one process's losses (1e-4), and the adapter saved is one process's, whole."""
    from safetensors.torch import load_file

    argv = ["--model_name_or_path", base, "--do_train", "--train_file", str(data), "--do_eval", "false",
            "--max_steps", "4", "--logging_steps", "1", "--per_device_train_batch_size", "8", "--src_length", "24",
            "--tgt_length", "16", "--lora", "--lora_target_modules", "query_key_value,dense_h_to_4h,dense_4h_to_h"]
    _as_one_process(argv, tmp_path, capsys)
    tp, one = (load_file(tmp_path / d / "final" / "adapter_model.safetensors") for d in ("tp", "one"))
    assert tp.keys() == one.keys() and any("dense_h_to_4h" in key for key in one)
    for key, value in one.items():
        torch.testing.assert_close(tp[key], value, rtol=1e-3, atol=1e-5, msg=key)


def test_history_column_and_tool_conversations_are_the_prompt_glm_4s_chat_builds(tiny, tmp_path):
    """THUDM ChatGLM2 ptuning's history_column and a conversations sample with tools, read from files as
    glm-finetune reads them: the ids before the answer are the prompt GLM-4's chat builds for the same query and
    history (``build_inputs``, glm-chat's; with tools the chat template, glm-serve's), and only the assistant
    turns are counted."""
    from glm_port.finetune.datasets import read_pairs
    from glm_port.models.glm4.chat import build_inputs

    model, tok = tiny
    command = tok.get_command
    path = tmp_path / "h.json"
    path.write_text(json.dumps({"prompt": "还有呢", "response": "蓝色", "history": [["颜色", "红色"]]},
                               ensure_ascii=False) + "\n", encoding="utf-8")
    pair, = read_pairs(path, "plain", "prompt", "response", history_column="history")
    sample, = encode(tok, [pair], 256, 64)
    chat_prompt = build_inputs(model, tok, "还有呢", [("颜色", "红色")])["input_ids"][0].tolist()
    assert sample.text[:sample.sep].tolist() == chat_prompt
    counted = sample.target[sample.loss_mask == 1].tolist()
    assert counted == [*tok.encode_text("\n"), *tok.encode_text("红色"), command("<|user|>"),
                       *tok.encode_text("\n"), *tok.encode_text("蓝色"), command("<|user|>")]

    tools = [{"name": "get_weather", "description": "weather", "parameters": {"type": "object", "properties": {}}}]
    turns = [{"role": "system", "content": "You help.", "tools": tools}, {"role": "user", "content": "天气?"},
             {"role": "assistant", "metadata": "get_weather", "content": '{"city": "北京"}'},
             {"role": "observation", "content": "sunny"}, {"role": "assistant", "content": "It is sunny."}]
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"conversations": turns}, ensure_ascii=False) + "\n", encoding="utf-8")
    pair, = read_pairs(path, "conversations")
    sample, = encode(tok, [pair], 512, 64)
    # with tools the prompt is the chat template's (glm-serve's encode_messages, THUDM's finetune_demo)
    templated = [{**m, "tools": [{"type": "function", "function": t} for t in tools]} if "tools" in m else m
                 for m in turns[:4]]
    chat_prompt = tok.apply_chat_template(templated, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert sample.text[:sample.sep].tolist() == list(chat_prompt)
    roles = {command(f"<|{r}|>"): r for r in ("system", "user", "assistant", "observation")}
    ids = sample.text.tolist()
    for k in range(len(ids) - 1):  # a counted position predicts ids[k + 1]: it lies in an assistant turn
        if sample.loss_mask[k]:
            assert roles[next(ids[p] for p in range(k, -1, -1) if ids[p] in roles)] == "assistant", k


@pytest.mark.parametrize("turns, message", [
    ([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}, {"role": "assistant", "content": "c"}],
     ":2: roles do not alternate: turn 2 is a user turn after a user turn (expected assistant)"),
    ([{"role": "system", "content": "s"}, {"role": "user", "content": "a"}],
     ":2: the conversation has no assistant turn to learn"),
])
def test_a_bad_conversation_is_one_line_naming_file_and_line_and_nothing_is_written(base, tmp_path, capsys,
                                                                                    turns, message):
    good = {"conversations": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}
    path = tmp_path / "chats.json"
    path.write_text(json.dumps(good) + "\n" + json.dumps({"conversations": turns}) + "\n", encoding="utf-8")
    with pytest.raises(SystemExit) as stop:
        finetune_main(["--model_name_or_path", base, "--dataset_layout", "conversations", "--do_train",
                       "--train_file", str(path), "--output_dir", str(tmp_path / "out")])
    assert stop.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"glm-finetune: error: {path}{message}"]
    assert not (tmp_path / "out").exists()
