"""What the ChatGLM2 family offers shared finetuning (glm-finetune, issue 18): samples, LoRA targets.

ADGEN as THUDM's ``ptuning/main.py`` prepares it: the source (``content``) goes through ``build_prompt``
and is encoded with the ``[gMASK] sop`` prefix, truncated to ``max_source_length`` (64) tokens; the
target (``summary``) is encoded bare, truncated to ``max_target_length`` (128), and ``</s>`` appended.
``input_ids = prompt + target + eos``, ``labels`` the same with the prompt (and padding) set to -100,
padded on the right to ``64 + 128 + 1`` for training. The model's loss over these labels is THUDM's
(next-token cross entropy, mean over counted positions = ``sum(loss*mask)/mask.sum()``).

LoRA as MindFormers trains ChatGLM2 on ADGEN: rank 8, alpha 32, dropout 0.1 on ``query_key_value``.
"""

from __future__ import annotations

IGNORE_INDEX = -100
LORA_TARGET_MODULES = ("query_key_value",)
LORA_DEFAULTS = dict(r=8, lora_alpha=32, lora_dropout=0.1)


def adgen_train_example(tokenizer, content: str, summary: str, history=None, max_source_length: int = 64,
                        max_target_length: int = 128, pad: bool = True) -> dict:
    """``{"input_ids", "labels"}`` (lists of ints) for one ADGEN training sample, as ptuning/main.py builds it."""
    prompt = tokenizer.build_prompt(content, history)
    a_ids = tokenizer.encode(prompt, add_special_tokens=True, truncation=True, max_length=max_source_length)
    b_ids = tokenizer.encode(summary, add_special_tokens=False, truncation=True, max_length=max_target_length)
    input_ids = a_ids + b_ids + [tokenizer.eos_token_id]
    labels = [IGNORE_INDEX] * len(a_ids) + b_ids + [tokenizer.eos_token_id]
    if pad:
        pad_len = max_source_length + max_target_length + 1 - len(input_ids)
        input_ids += [tokenizer.pad_token_id] * pad_len
        labels += [IGNORE_INDEX] * pad_len
    # ptuning/main.py (ignore_pad_token_for_loss) also stops counting any target token equal to the pad id.
    labels = [IGNORE_INDEX if label == tokenizer.pad_token_id else label for label in labels]
    return {"input_ids": input_ids, "labels": labels}


def adgen_eval_example(tokenizer, content: str, summary: str, history=None, max_source_length: int = 64) -> dict:
    """``{"input_ids", "reference"}``: the prompt to generate from (left-padded later in a batch), the text to score."""
    prompt = tokenizer.build_prompt(content, history)
    ids = tokenizer.encode(prompt, add_special_tokens=True, truncation=True, max_length=max_source_length)
    return {"input_ids": ids, "reference": summary}


def lora_config(**overrides):
    """PEFT ``LoraConfig`` for ChatGLM2 (MindFormers' ADGEN settings unless overridden)."""
    from peft import LoraConfig, TaskType

    settings = {**LORA_DEFAULTS, "target_modules": list(LORA_TARGET_MODULES), **overrides}
    return LoraConfig(task_type=TaskType.CAUSAL_LM, **settings)
