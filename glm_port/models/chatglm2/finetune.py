"""What the ChatGLM2 family offers shared finetuning (glm-finetune, issue 18): samples, LoRA targets.

ADGEN as THUDM's ``ptuning/main.py`` prepares it: the source (``content``) goes through ``build_prompt``
and is encoded with the ``[gMASK] sop`` prefix, truncated to ``max_source_length`` (64) tokens; the
target (``summary``) is encoded bare, truncated to ``max_target_length`` (128), and ``</s>`` appended.
``input_ids = prompt + target + eos``, ``labels`` the same with the prompt (and padding) set to -100,
padded on the right to ``64 + 128 + 1`` for training. The model's loss over these labels is THUDM's
(next-token cross entropy, mean over counted positions = ``sum(loss*mask)/mask.sum()``).

A ChatGLM3 tokenizer (``chat_format`` "chatglm3") gets ChatGLM3's own layout instead, as THUDM's
ChatGLM3 ``finetune_demo/finetune_hf.py`` builds a one-turn conversation: ``[gMASK] sop``, the source as a
``<|user|>`` message and the target as an ``<|assistant|>`` message (``build_single_message``: role token,
``"\n"``, text), then ``</s>``; the whole sequence cut to ``64 + 128 + 1``. Counted are the tokens that
follow an assistant token: the answer's ``"\n"``, its text and ``</s>``, not ``<|assistant|>`` itself. The
prompt to generate from ends with ``<|assistant|>`` (source part cut to 64), which is what ``chat`` feeds
the model, so a model finetuned here answers in ``glm-chat``.

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


def chatglm3_train_example(tokenizer, content: str, summary: str, max_source_length: int = 64,
                           max_target_length: int = 128) -> dict:
    """``{"input_ids", "labels"}`` of one ChatGLM3 sample (one user turn, one assistant turn), unpadded."""
    user = tokenizer.build_single_message("user", "", content)
    answer = tokenizer.build_single_message("assistant", "", summary)
    head = [tokenizer.get_command("[gMASK]"), tokenizer.get_command("sop")] + user
    input_ids = head + answer + [tokenizer.eos_token_id]
    first = len(head) + 1  # the first token after <|assistant|>: from there on every token is counted
    labels = [IGNORE_INDEX] * first + input_ids[first:]
    cap = max_source_length + max_target_length + 1
    return {"input_ids": input_ids[:cap], "labels": labels[:cap]}


def chatglm3_eval_example(tokenizer, content: str, summary: str, max_source_length: int = 64) -> dict:
    """``{"input_ids", "reference"}``: ``[gMASK] sop`` + the user message (cut to ``max_source_length``) +
    ``<|assistant|>``, the prompt ``chat`` would build for ``content``."""
    head = [tokenizer.get_command("[gMASK]"), tokenizer.get_command("sop")]
    ids = (head + tokenizer.build_single_message("user", "", content))[:max_source_length]
    return {"input_ids": ids + [tokenizer.get_command("<|assistant|>")], "reference": summary}


def lora_config(**overrides):
    """PEFT ``LoraConfig`` for ChatGLM2 (MindFormers' ADGEN settings unless overridden)."""
    from peft import LoraConfig, TaskType

    settings = {**LORA_DEFAULTS, "target_modules": list(LORA_TARGET_MODULES), **overrides}
    return LoraConfig(task_type=TaskType.CAUSAL_LM, **settings)


# ---- the binding glm-finetune drives (same names in every family: see glm_port/models/glm/finetune.py) ----

EMBEDDED = "chatglm2-tiny"


def load(path, device, recompute: bool = False, tokenizer_path=None):
    """``(model, tokenizer)``: a ChatGLM2 directory, or (None) the embedded random-init tiny model; the
    tokenizer from ``tokenizer_path`` (a directory holding ``tokenizer.model``, or that file) when given."""
    from pathlib import Path

    from glm_port.models.chatglm2.weights import load_tokenizer

    if tokenizer_path is not None:
        tokenizer_path = Path(tokenizer_path)
        tokenizer = load_tokenizer(tokenizer_path.parent if tokenizer_path.is_file() else tokenizer_path)
    if path is None:
        from glm_port.models.chatglm2.tiny import build_tiny

        model, tiny_tokenizer = build_tiny()
        tokenizer = tiny_tokenizer if tokenizer_path is None else tokenizer
    else:
        from glm_port.models.chatglm2.weights import load_pretrained

        from glm_port.distributed import tensor_parallel_size

        if tokenizer_path is None:
            if not (Path(path) / "tokenizer.model").is_file():
                raise FileNotFoundError(f"no ChatGLM2 tokenizer in {path} (expected tokenizer.model)")
            tokenizer = load_tokenizer(path)
        if tensor_parallel_size() > 1:  # each rank reads its slices (Q heads | K, V groups split as THUDM's)
            from glm_port.models.chatglm2.generation import load_split
            from glm_port.models.chatglm2.weights import check_directory

            model = load_split(path, check_directory(path), device=device)
        else:
            model = load_pretrained(path, dtype=None, device=device)
    model = model.to(device=device, dtype=next(model.parameters()).dtype)
    if recompute:  # every GLMBlock checkpointed (transformers' API; its older name before the 5.x rename)
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
    return model, tokenizer


def tokenizer_home(path):
    """Where the tokenizer of the model at ``path`` is: its directory (``tokenizer.model`` beside the weights)."""
    from pathlib import Path

    return Path(path)


def fit_lengths(model, src_length: int, tgt_length: int) -> tuple[int, int]:
    """``(src_length, tgt_length)`` within ``seq_length``: a training sample is ``src + tgt + 1`` tokens, a
    prompt and its generated answer ``src + tgt``. The source gives way first (down to half the positions)."""
    budget = model.config.seq_length - 1
    if src_length + tgt_length <= budget:
        return src_length, tgt_length
    src = min(src_length, max(budget - tgt_length, budget // 2))
    return src, min(tgt_length, budget - src)


def config_of(model):
    return model.config


def fingerprint(tokenizer) -> str:
    import hashlib

    with open(tokenizer.vocab_file, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()[:16]


def encode(tokenizer, pairs, src_length: int, tgt_length: int, with_targets: bool = True):
    """Each pair as ``ptuning/main.py`` builds an ADGEN sample (the source through ``build_prompt``), in
    glm_port's batch layout: ``text`` the ids, ``target`` the next token at each position, ``loss_mask`` 1
    on the answer and its ``</s>``."""
    import numpy as np

    from glm_port.training import Encoded

    chatglm3 = getattr(tokenizer, "is_chatglm3", False)
    samples = []
    for pair in pairs:
        if with_targets and chatglm3:
            built = chatglm3_train_example(tokenizer, pair.source, pair.target, src_length, tgt_length)
            ids, labels = built["input_ids"], built["labels"]
            truncated = built["labels"][-1] != tokenizer.eos_token_id  # the cut fell inside the answer
        elif with_targets:
            built = adgen_train_example(tokenizer, pair.source, pair.target, max_source_length=src_length,
                                        max_target_length=tgt_length, pad=False)
            ids, labels = built["input_ids"], built["labels"]
            truncated = len(tokenizer.encode(pair.target, add_special_tokens=False)) > tgt_length
        else:
            example = chatglm3_eval_example if chatglm3 else adgen_eval_example
            ids = example(tokenizer, pair.source, pair.target, max_source_length=src_length)["input_ids"]
            labels, truncated = [IGNORE_INDEX] * len(ids), False
        target = np.asarray(labels[1:] + [IGNORE_INDEX], dtype=np.int64)
        counted = target != IGNORE_INDEX
        prompt = next((k + 1 for k, label in enumerate(labels[1:]) if label != IGNORE_INDEX), len(ids))
        samples.append(Encoded(
            text=np.asarray(ids, dtype=np.int64), position_id=np.arange(len(ids), dtype=np.int64), sep=prompt,
            target=np.where(counted, target, 0), loss_mask=counted.astype(np.float32), truncated_target=truncated,
        ))
    return samples


def collate(samples, tokenizer) -> dict:
    """Right-padded batch; ``attention_mask`` ``[b, s]`` marks the real tokens (attention is causal)."""
    import torch

    from glm_port.training import collate as padded

    batch = padded(samples, tokenizer.pad_token_id)
    lengths = torch.tensor([len(s.text) for s in samples])
    batch["attention_mask"] = (torch.arange(batch["text"].size(1)) < lengths[:, None]).long()
    return batch


def logits(model, batch: dict, counted):
    """Logits of the counted positions only. Under tensor parallel, this rank's vocabulary slice (Megatron's
    parallel output, what the vocab-parallel cross entropy takes), the hidden states through copy-to-region
    so their gradient sums the ranks' slices."""
    import torch.nn.functional as F

    from glm_port.distributed import tensor_parallel_size

    transformer = model.transformer
    hidden = transformer(batch["text"], batch["attention_mask"], use_cache=False).last_hidden_state[counted]
    weight, size = transformer.output_layer.weight, tensor_parallel_size()
    if size == 1:
        return F.linear(hidden, weight)
    import shim.distributed as dist
    from shim import mpu

    rank = dist.current_layout().tensor_parallel_rank
    if weight.requires_grad:  # the whole (replicated) output layer: each rank's rows' gradients summed
        weight = mpu.copy_to_model_parallel_region(weight)
    return F.linear(mpu.copy_to_model_parallel_region(hidden), weight.chunk(size, dim=0)[rank])


def generate(model, tokenizer, samples, search: dict, batch_size: int, device) -> list[str]:
    """The prompt (``[gMASK] sop`` + ``build_prompt(source)``, or ChatGLM3's up to ``<|assistant|>``) continued
    until ``</s>`` (or, in ChatGLM3's format, the next role token ``chat`` stops at), left-padded batches."""
    import torch

    from glm_port.models.chatglm2.chat import stop_ids
    from glm_port.training import left_padded

    stops = stop_ids(model, tokenizer)
    search = {"eos_token_id": stops, "pad_token_id": model.config.pad_token_id, **search}
    texts = []
    for start in range(0, len(samples), batch_size):
        ids, mask = left_padded([s.text[:s.sep] for s in samples[start:start + batch_size]], tokenizer.pad_token_id)
        with torch.no_grad():
            out = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), **search)
        for row in out[:, ids.size(1):].tolist():
            cut = next((k for k, t in enumerate(row) if t in stops or t == search["pad_token_id"]), len(row))
            texts.append(tokenizer.decode(row[:cut]).strip())
    return texts


def save(model, tokenizer, directory, source=None) -> None:
    model.save_pretrained(directory)
    save_tokenizer(tokenizer, directory, source)


def save_tokenizer(tokenizer, directory, source=None) -> None:
    tokenizer.save_pretrained(directory)
