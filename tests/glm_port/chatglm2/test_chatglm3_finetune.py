"""glm-finetune on a ChatGLM3 tokenizer: THUDM's ChatGLM3 finetune_demo layout (a user and an assistant
message between ``[gMASK] sop`` and ``</s>``), whose prompt is the one ``chat`` builds, so the finetuned
model answers in glm-chat's format. On a tiny ChatGLM3-format model and sentencepiece model made here."""

import json
import re

import pytest

from glm_port.finetune.datasets import Pair
from glm_port.finetune.run import main as finetune_main
from glm_port.models.chatglm2.finetune import IGNORE_INDEX, chatglm3_train_example, encode, save

LOSS = re.compile(r"^ iteration +(\d+)/ +\d+ \| .* \| lm loss (\S+) \|$", re.MULTILINE)  # glm-finetune's log


@pytest.fixture(scope="module")
def tok3():
    from glm_port.models.chatglm2.tiny import build_tokenizer

    return build_tokenizer(chat_format="chatglm3")


def test_sample_is_a_user_and_an_assistant_message_counting_what_follows_the_assistant_token(tok3):
    built = chatglm3_train_example(tok3, "红色连衣裙", "很好看")
    command, text = tok3.get_command, tok3.sp_model.encode
    head = [command("[gMASK]"), command("sop"), command("<|user|>"), *text("\n"), *text("红色连衣裙")]
    answer = [*text("\n"), *text("很好看"), tok3.eos_token_id]
    assert built["input_ids"] == head + [command("<|assistant|>")] + answer
    assert built["labels"] == [IGNORE_INDEX] * (len(head) + 1) + answer
    cut = chatglm3_train_example(tok3, "红色连衣裙", "很好看", max_source_length=len(head), max_target_length=2)
    assert cut["input_ids"] == built["input_ids"][:len(head) + 3]  # the whole sequence cut to 64 + 128 + 1


def test_encoded_prompt_is_chats_prompt_and_the_loss_predicts_the_answer(tok3):
    train, = encode(tok3, [Pair("红色连衣裙", "很好看")], 64, 128)
    prompt = tok3.build_chat_input("红色连衣裙")["input_ids"][0].tolist()
    assert train.text[:train.sep].tolist() == prompt  # what chat() feeds the model, ending with <|assistant|>
    counted = train.target[train.loss_mask == 1].tolist()  # each counted position predicts the next token
    assert counted == [*tok3.sp_model.encode("\n"), *tok3.sp_model.encode("很好看"), tok3.eos_token_id]
    assert not train.truncated_target
    short, = encode(tok3, [Pair("红色连衣裙", "很好看" * 20)], 8, 4)
    assert short.truncated_target and len(short.text) == 8 + 4 + 1
    generate_from, = encode(tok3, [Pair("红色连衣裙", "很好看")], 64, 128, with_targets=False)
    assert generate_from.text[:generate_from.sep].tolist() == prompt


def test_glm_finetune_trains_a_chatglm3_model_and_scores_its_answers(tmp_path, capsys):
    from glm_port.finetune.toy_task import write_toy_task
    from glm_port.models.chatglm2.tiny import build_tiny
    from glm_port.models.chatglm2.weights import load_tokenizer

    (tmp_path / "tokenizer").mkdir()
    save(*build_tiny(str(tmp_path / "tokenizer"), chat_format="chatglm3"), tmp_path / "base")
    train, evaluation = write_toy_task(tmp_path / "data")
    finetune_main(["--model_name_or_path", str(tmp_path / "base"), "--do_train", "--do_eval", "--train_file",
                   str(train), "--eval_file", str(evaluation), "--max_steps", "6", "--logging_steps", "1",
                   "--eval_steps", "0", "--learning_rate", "1e-2", "--src_length", "16", "--tgt_length", "12",
                   "--per_device_eval_batch_size", "16", "--output_dir", str(tmp_path / "out")])
    out = capsys.readouterr().out
    losses = {int(m[1]): float(m[2]) for m in LOSS.finditer(out)}
    assert sorted(losses) == list(range(1, 7)) and losses[6] < losses[1]
    assert set(json.loads((tmp_path / "out" / "eval_results.json").read_text())) >= {"rouge-l", "bleu-4"}
    assert load_tokenizer(tmp_path / "out" / "final").chat_format == "chatglm3"  # glm-chat reads it as ChatGLM3
