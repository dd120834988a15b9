"""What ChatGLM2 offers glm-finetune: ADGEN samples built as THUDM's ptuning/main.py builds them, and
MindFormers' LoRA settings through PEFT."""

import torch

from glm_port.models.chatglm2.finetune import adgen_eval_example, adgen_train_example, lora_config


def test_adgen_sample_layout(tiny):
    _, tok = tiny
    content, summary = "类型#裙*颜色#蓝色*风格#清新", "这件衣服的颜色很漂亮，款式简单大方。"
    sample = adgen_train_example(tok, content, summary)
    ids, labels = sample["input_ids"], sample["labels"]
    prompt = tok.encode(tok.build_prompt(content))  # with the [gMASK] sop prefix
    answer = tok.encode(summary, add_special_tokens=False)
    assert len(ids) == len(labels) == 64 + 128 + 1
    n = len(prompt) + len(answer) + 1
    assert ids[:n] == prompt + answer + [tok.eos_token_id] and ids[n:] == [tok.pad_token_id] * (193 - n)
    assert labels[:len(prompt)] == [-100] * len(prompt)
    assert labels[len(prompt):n] == answer + [tok.eos_token_id] and set(labels[n:]) == {-100}
    assert adgen_eval_example(tok, content, summary)["input_ids"] == prompt


def test_adgen_truncates_source_to_64_and_target_to_128(tiny):
    _, tok = tiny
    sample = adgen_train_example(tok, "颜色#蓝色*" * 60, "款式简单大方，" * 80)
    counted = [label for label in sample["labels"] if label != -100]
    assert len(counted) == 128 + 1 and counted[-1] == tok.eos_token_id
    assert sample["input_ids"][:2] == [tok.get_command("[gMASK]"), tok.get_command("sop")]
    assert sample["labels"][:64] == [-100] * 64 and sample["labels"][64] != -100


def test_lora_on_query_key_value_trains_only_the_adapters(tiny):
    from peft import get_peft_model

    model, tok = tiny
    config = lora_config()
    assert (config.r, config.lora_alpha, config.lora_dropout) == (8, 32, 0.1)
    peft_model = get_peft_model(model, config)
    try:
        trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
        assert trainable and all("lora_" in n and "query_key_value" in n for n in trainable)
        sample = adgen_train_example(tok, "类型#裙", "蓝色的裙子")
        batch = {k: torch.tensor([v]) for k, v in sample.items()}
        peft_model.train()
        loss = peft_model(**batch).loss
        loss.backward()
        assert torch.isfinite(loss)
        grads = [p.grad for n, p in peft_model.named_parameters() if "lora_B" in n]
        assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)
    finally:
        peft_model.unload()
        model.eval()
