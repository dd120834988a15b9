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

Conversations (issue 30). A sample with a ``history`` (THUDM ChatGLM2 ptuning's ``history_column``:
``[query, response]`` pairs) is built with ``build_prompt(query, history)``, the ``[Round i]`` prompt
``chat`` builds; the loss counts the last response only, as ptuning/main.py. A ``conversations`` sample
(ChatGLM3 ``finetune_demo``'s roles system/user/assistant/observation, ``tools`` on the system turn) on a
ChatGLM3 tokenizer is every message as ``build_single_message`` (the system turn's ``tools`` appended as
indented JSON, as ``build_chat_input`` does), ``[gMASK] sop`` before and ``</s>`` after; counted are the tokens
that follow an assistant token up to and including the token after the turn (its ``"\n"``, text, and the next
role token or ``</s>``) for every assistant turn, as finetune_demo's shifted loss mask; the prompt of an eval
sample is the conversation up to its last assistant turn then ``<|assistant|>``, what ``build_chat_input``
gives. On a ChatGLM2 tokenizer a conversation must be user/assistant turns only and reads as a history.

LoRA as MindFormers trains ChatGLM2 on ADGEN: rank 8, alpha 32, dropout 0.1 on ``query_key_value``.

P-Tuning v2 as THUDM's ``ptuning/`` trains it (``--pre_seq_len``, ``--prefix_projection``): the loaded model
frozen, a prefix encoder in fp32 (THUDM's ``prefix_encoder.float()``) the only trained weights
(``model.attach_prefix``); saved as THUDM's trainer saves it, ``pytorch_model.bin`` holding only
``transformer.prefix_encoder.*`` beside ``config.json`` (``pre_seq_len``, ``prefix_projection``) and the
tokenizer, which ``--ptuning_checkpoint`` (here, in glm-chat and glm-generate, and in THUDM's main.py and
web_demo.py) puts back on the base model.
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
    return chatglm3_conversation_example(tokenizer, [{"role": "user", "content": content},
                                                     {"role": "assistant", "content": summary}],
                                         max_source_length, max_target_length)


def message_ids(tokenizer, message: dict) -> list[int]:
    """One ChatGLM3 message as ``build_chat_input`` encodes it: a system turn's ``tools`` appended to its
    content as indented JSON, then ``build_single_message(role, metadata, content)``."""
    import json

    content = message["content"]
    if message["role"] == "system" and "tools" in message:
        content = content + "\n" + json.dumps(message["tools"], indent=4, ensure_ascii=False)
    return tokenizer.build_single_message(message["role"], message.get("metadata", ""), content)


def chatglm3_conversation_example(tokenizer, messages, max_source_length: int = 64,
                                  max_target_length: int = 128) -> dict:
    """``{"input_ids", "labels"}`` of a ChatGLM3 conversation, as finetune_demo's ``process_batch`` builds it:
    ``[gMASK] sop``, each message, ``</s>``; a token is counted when the one before it belongs to an assistant
    message (so every assistant turn's ``"\n"``, text and the token after it); the whole cut to
    ``max_source_length + max_target_length + 1``."""
    prefix = [tokenizer.get_command("[gMASK]"), tokenizer.get_command("sop")]
    return role_conversation(messages, prefix, lambda message: message_ids(tokenizer, message),
                             tokenizer.eos_token_id, max_source_length, max_target_length)


def role_conversation(messages, prefix: list[int], encode_message, end: int, max_source_length: int = 64,
                      max_target_length: int = 128) -> dict:
    """``{"input_ids", "labels"}`` of a conversation in a role-token format (ChatGLM3's, GLM-4's), as THUDM's
    finetune_demo ``process_batch`` builds one: ``prefix``, each message as ``encode_message(message)`` gives its
    ids, then ``end``; a token is counted when the one before it belongs to an assistant message; the whole cut
    to ``max_source_length + max_target_length + 1``."""
    input_ids = list(prefix)
    assistant = [False] * len(prefix)
    for message in messages:
        part = encode_message(message)
        input_ids += part
        assistant += [message["role"] == "assistant"] * len(part)
    input_ids.append(end)
    labels = [IGNORE_INDEX] + [t if after else IGNORE_INDEX for t, after in zip(input_ids[1:], assistant)]
    cap = max_source_length + max_target_length + 1
    return {"input_ids": input_ids[:cap], "labels": labels[:cap]}


def role_prompt(messages, prefix: list[int], encode_message, assistant: int, max_source_length: int = 64) -> list[int]:
    """``prefix`` + the messages (``encode_message`` each; the whole cut to ``max_source_length``) + ``assistant``
    (the role token a reply follows): where a reply starts in a role-token format (ChatGLM3's, GLM-4's)."""
    ids = list(prefix)
    for message in messages:
        ids += encode_message(message)
    return ids[:max_source_length] + [assistant]


def prompt_messages(messages) -> list:
    """The messages a reply is generated after: up to the last assistant turn when the conversation ends with
    one (its reply is the reference), else all of them."""
    messages = list(messages)
    if messages and messages[-1]["role"] == "assistant":
        last = max(k for k, m in enumerate(messages) if m["role"] == "assistant")
        while last > 0 and messages[last - 1]["role"] == "assistant":  # one reply may span several segments
            last -= 1
        return messages[:last]
    return messages


def chatglm3_prompt(tokenizer, messages, max_source_length: int = 64) -> list[int]:
    """``[gMASK] sop`` + the messages (cut to ``max_source_length``) + ``<|assistant|>``: what
    ``build_chat_input`` builds for the last message as the query and the others as its history."""
    return role_prompt(messages, [tokenizer.get_command("[gMASK]"), tokenizer.get_command("sop")],
                       lambda message: message_ids(tokenizer, message), tokenizer.get_command("<|assistant|>"),
                       max_source_length)


def as_history(pair) -> tuple[str, str, list]:
    """``(query, response, history)`` of a ChatGLM2 sample: its ``history`` pairs, or a conversation of
    alternating user/assistant turns read as one (the last assistant turn the response)."""
    messages = list(getattr(pair, "messages", ()) or ())
    if not messages:
        return pair.source, pair.target, [tuple(turn) for turn in getattr(pair, "history", ()) or ()]
    where = getattr(pair, "where", "") or "a conversation"
    roles = [m["role"] for m in messages]
    if any(r not in ("user", "assistant") for r in roles) or \
            any(r != ("user" if k % 2 == 0 else "assistant") for k, r in enumerate(roles)):
        odd = next((r for r in roles if r not in ("user", "assistant")), None)
        why = f"a {odd} turn" if odd else "turns that do not alternate user, assistant"
        raise ValueError(f"{where}: ChatGLM2's prompt has user and assistant turns only, alternating; this "
                         f"conversation has {why} (system, observation and tools are ChatGLM3's)")
    if roles[-1] == "assistant":
        turns = [(messages[k]["content"], messages[k + 1]["content"]) for k in range(0, len(messages) - 2, 2)]
        return messages[-2]["content"], messages[-1]["content"], turns
    turns = [(messages[k]["content"], messages[k + 1]["content"]) for k in range(0, len(messages) - 1, 2)]
    return messages[-1]["content"], "", turns


def conversation_of(pair) -> list[dict]:
    """A ChatGLM3 sample's messages: its conversation, or its history pairs + the source and target turns."""
    messages = list(getattr(pair, "messages", ()) or ())
    if messages:
        return messages
    turns = []
    for query, response in getattr(pair, "history", ()) or ():
        turns += [{"role": "user", "content": query}, {"role": "assistant", "content": response}]
    return turns + [{"role": "user", "content": pair.source}, {"role": "assistant", "content": pair.target}]


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


def load(path, device, recompute: bool = False, tokenizer_path=None, pre_seq_len: int | None = None,
         prefix_projection: bool = False, ptuning_checkpoint=None, meta: bool = False):
    """``(model, tokenizer)``: a ChatGLM2 directory, or (None) the embedded random-init tiny model; the
    tokenizer from ``tokenizer_path`` (a directory holding ``tokenizer.model``, or that file) when given.
    ``pre_seq_len``: a new P-Tuning v2 prefix of that length (``prefix_projection``: THUDM's MLP) on the
    frozen model; ``ptuning_checkpoint``: the prefix of that P-Tuning checkpoint (``pre_seq_len`` and
    ``prefix_projection``, when given, must be its). ``meta``: the same model built on the meta device from the
    config alone, no weight read (fp32; a sharded run's ranks other than 0, filled from rank 0's weights)."""
    from pathlib import Path

    import torch

    from glm_port.models.chatglm2.model import ChatGLM2ForCausalLM
    from glm_port.models.chatglm2.weights import load_tokenizer

    if tokenizer_path is not None:
        tokenizer_path = Path(tokenizer_path)
        tokenizer = load_tokenizer(tokenizer_path.parent if tokenizer_path.is_file() else tokenizer_path)
    if path is None:
        from glm_port.models.chatglm2.tiny import build_tiny

        if meta:
            with torch.device("meta"):
                model, tiny_tokenizer = build_tiny()
        else:
            model, tiny_tokenizer = embedded_model(build_tiny, ChatGLM2ForCausalLM, device)
        tokenizer = tiny_tokenizer if tokenizer_path is None else tokenizer
    else:
        from glm_port.distributed import tensor_parallel_size
        from glm_port.models.chatglm2.weights import check_directory

        if tokenizer_path is None:
            if not (Path(path) / "tokenizer.model").is_file():
                raise FileNotFoundError(f"no ChatGLM2 tokenizer in {path} (expected tokenizer.model)")
            tokenizer = load_tokenizer(path)
        if meta:
            with torch.device("meta"):
                model = ChatGLM2ForCausalLM(check_directory(path, quantized=False)).eval()
            model.config._name_or_path = str(path)  # as load_pretrained records it
        elif tensor_parallel_size() > 1:  # each rank reads its slices (Q heads | K, V groups split as THUDM's)
            from glm_port.models.chatglm2.generation import load_split

            model = load_split(path, check_directory(path), device=device)
        else:
            from glm_port.models.chatglm2.weights import load_pretrained

            model = load_pretrained(path, dtype=None, device=device)
    if not meta:
        model = model.to(device=device, dtype=next(model.parameters()).dtype)
    attach_ptuning(model, pre_seq_len, prefix_projection, ptuning_checkpoint)
    if recompute:  # every GLMBlock checkpointed (transformers' API; its older name before the 5.x rename)
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
    return model, tokenizer


def embedded_model(build_tiny, model_class, device):
    """``(model, tokenizer)``: an embedded tiny model of ChatGLM2's network (``build_tiny``, ``model_class``: the
    family's); under tensor parallelism each rank's slices of the one model a single process builds (built whole
    outside the layout, then copied as ``load_split`` copies a directory's), so a tensor-parallel run trains the
    same weights as one process."""
    import torch

    from shim.distributed import whole_layers

    from glm_port.distributed import tensor_parallel_size
    from glm_port.models.chatglm2.weights import load_tensor_parallel

    if tensor_parallel_size() == 1:
        return build_tiny()
    with whole_layers():
        whole, tokenizer = build_tiny()
    with torch.random.fork_rng():  # the split model's own random init is overwritten: leave the RNG as one process
        model = model_class(whole.config)
    load_tensor_parallel(model, whole.state_dict())
    return model.to(device=device).eval(), tokenizer


def attach_ptuning(model, pre_seq_len: int | None = None, prefix_projection: bool = False, ptuning_checkpoint=None):
    """glm-finetune's P-Tuning v2 on a loaded model of ChatGLM2's network (ChatGLM2's, GLM-4's), in place: the
    prefix of the P-Tuning checkpoint ``ptuning_checkpoint`` (``pre_seq_len`` and ``prefix_projection``, when
    given, must be its), else a new one of ``pre_seq_len`` positions (``prefix_projection``: THUDM's MLP); the
    model frozen. Nothing asked for: nothing done."""
    from glm_port.models.chatglm2.model import attach_prefix

    if ptuning_checkpoint is not None:
        from glm_port.models.chatglm2.weights import WeightsError, read_ptuning_checkpoint

        config, state = read_ptuning_checkpoint(ptuning_checkpoint, model.config, pre_seq_len)
        if prefix_projection and not config.prefix_projection:
            raise WeightsError(f"--prefix_projection: the P-Tuning checkpoint {ptuning_checkpoint} has no projection")
        attach_prefix(model, config.pre_seq_len, config.prefix_projection, config.prefix_hidden_size, state)
    elif pre_seq_len is not None:
        attach_prefix(model, pre_seq_len, prefix_projection)
    return model


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
        sep = None
        if chatglm3:
            messages = conversation_of(pair)
            if with_targets:
                built = chatglm3_conversation_example(tokenizer, messages, src_length, tgt_length)
                ids, labels = built["input_ids"], built["labels"]
                truncated = built["labels"][-1] != tokenizer.eos_token_id  # the cut fell inside the answer
                # Generation (evaluation) answers the last assistant turn: the prompt is all before it.
                sep = min(len(chatglm3_prompt(tokenizer, prompt_messages(messages), len(ids))), len(ids))
            else:
                ids = chatglm3_prompt(tokenizer, prompt_messages(messages), src_length)
                labels, truncated = [IGNORE_INDEX] * len(ids), False
        else:
            query, response, history = as_history(pair)
            if with_targets:
                built = adgen_train_example(tokenizer, query, response, history, max_source_length=src_length,
                                            max_target_length=tgt_length, pad=False)
                ids, labels = built["input_ids"], built["labels"]
                truncated = len(tokenizer.encode(response, add_special_tokens=False)) > tgt_length
            else:
                ids = adgen_eval_example(tokenizer, query, response, history, src_length)["input_ids"]
                labels, truncated = [IGNORE_INDEX] * len(ids), False
        target = np.asarray(labels[1:] + [IGNORE_INDEX], dtype=np.int64)
        counted = target != IGNORE_INDEX
        prompt = next((k + 1 for k, label in enumerate(labels[1:]) if label != IGNORE_INDEX), len(ids))
        if chatglm3 and with_targets:
            prompt = sep
        samples.append(Encoded(
            text=np.asarray(ids, dtype=np.int64), position_id=np.arange(len(ids), dtype=np.int64), sep=prompt,
            target=np.where(counted, target, 0), loss_mask=counted.astype(np.float32), truncated_target=truncated,
        ))
    return samples


def collate(samples, tokenizer) -> dict:
    """Right-padded batch; ``attention_mask`` ``[b, s]`` marks the real tokens (attention is causal)."""
    import torch

    from glm_port.training import pad_batch

    batch = pad_batch(samples, tokenizer.pad_token_id)
    lengths = torch.tensor([len(s.text) for s in samples])
    batch["attention_mask"] = (torch.arange(batch["text"].size(1)) < lengths[:, None]).long()
    return batch


def logits(model, batch: dict, counted):
    """Logits of the counted positions only. Under tensor parallel, this rank's vocabulary slice (Megatron's
    parallel output, what the vocab-parallel cross entropy takes), the hidden states through copy-to-region
    so their gradient sums the ranks' slices. The cross entropy takes equal slices (rank ``r`` holds ids from
    ``r * width``): a vocabulary that does not divide by the ranks (the tiny GLM-4's, exactly its tokenizer's
    973) is cut in slices of ``ceil(vocab / ranks)`` rows, the last one filled up with -inf logits, which take
    no probability and get no gradient."""
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
    width = -(-weight.size(0) // size)
    local = F.linear(mpu.copy_to_model_parallel_region(hidden), weight[rank * width:(rank + 1) * width])
    if local.size(-1) < width:
        local = F.pad(local, (0, width - local.size(-1)), value=float("-inf"))
    return local


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


PREFIX_KEYS = "transformer.prefix_encoder."


def save_prefix(model, tokenizer, directory, source=None) -> None:
    """A P-Tuning checkpoint in THUDM's layout: ``pytorch_model.bin`` holding the prefix encoder's weights
    (``transformer.prefix_encoder.*``, fp32) and nothing else, ``config.json`` (the base's, with
    ``pre_seq_len`` and ``prefix_projection``), the tokenizer."""
    from pathlib import Path

    import torch

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items() if k.startswith(PREFIX_KEYS)}
    torch.save(state, directory / "pytorch_model.bin")
    model.config.save_pretrained(directory)
    save_tokenizer(tokenizer, directory, source)


def save_base(model, tokenizer, directory, source=None) -> None:
    """The model under a P-Tuning prefix, saved without it (the embedded random base a checkpoint needs)."""
    import copy

    config = copy.deepcopy(model.config)
    config.pre_seq_len, config.prefix_projection, config.prefix_hidden_size = None, False, None
    state = {k: v for k, v in model.state_dict().items() if not k.startswith(PREFIX_KEYS)}
    model.save_pretrained(directory, state_dict=state)
    config.save_pretrained(directory)
    save_tokenizer(tokenizer, directory, source)


def save_tokenizer(tokenizer, directory, source=None) -> None:
    tokenizer.save_pretrained(directory)
