"""What the GLM-4 family offers glm-finetune: samples in GLM-4's chat layout; the rest is ChatGLM2's binding.

GLM-4's model is ChatGLM2's network (``glm_port.models.glm4.model``), so loading aside, the binding's model side
(``fit_lengths``, ``collate``, ``logits``, ``generate``, ``save``, LoRA on ``query_key_value``, activation
checkpointing through transformers' ``gradient_checkpointing_enable``) is ``glm_port.models.chatglm2.finetune``'s.
What differs is the tokenizer (GLM-4's tiktoken ``GLM4Tokenizer``) and the layout of a sample.

A sample is built as THUDM's GLM-4 ``finetune_demo/finetune.py`` (``process_batch``) builds a conversation:
``[gMASK]<sop>`` (151331, 151333), then each message as the chat template writes it alone
(``apply_chat_template([message])[2:]``: ``<|role|>{metadata}\\n{content}``; a system message's ``tools``
written by the template), then ``<|user|>`` (151336, finetune_demo's "EOS for chat", one of GLM-4's stop ids).
A token is counted when the one before it belongs to an assistant message (finetune_demo's ``loss_masks``
shifted by one): each assistant turn's ``"\\n"``, its text, and the token after it (the next role token or the
closing ``<|user|>``), never ``<|assistant|>`` itself. The whole sequence is cut to ``src + tgt + 1`` tokens
(finetune_demo's ``max_input_length + max_output_length + 1``). A single-turn pair is one user and one assistant
message: ``[gMASK]<sop><|user|>\\n{source}<|assistant|>\\n{target}<|user|>``, loss on ``\\n{target}<|user|>``.

The prompt to generate from (evaluation, ``--do_predict``) is the conversation up to its last assistant turn,
then ``<|assistant|>`` (the messages' part cut to ``src``): for plain text what ``build_chat_input`` and glm-chat
feed the model, so a model finetuned here answers in glm-chat and glm-serve.

P-Tuning v2 (``--pre_seq_len``, ``--prefix_projection``, ``--ptuning_checkpoint``): THUDM's GLM-4
``modeling_chatglm.py`` keeps ChatGLM2's ``PrefixEncoder`` (``pre_seq_len``, ``prefix_projection``), so the prefix
is ChatGLM2's (``chatglm2.finetune.attach_ptuning``: the model frozen, the encoder in fp32 the only trained
weights) and so is the checkpoint (``save_prefix``: ``pytorch_model.bin`` holding ``transformer.prefix_encoder.*``
alone, ``config.json`` with the prefix settings, GLM-4's tokenizer), which glm-generate and glm-chat
``--ptuning_checkpoint`` put back on the base (``weights.load_pretrained``).

Tensor parallel (``--tensor_parallel_degree``): each rank reads its slices of the directory's weights as
glm-generate does (``generation.load_split``: ChatGLM2's split plan); the logits and the vocab-parallel loss are
ChatGLM2's binding's; the shards saved (``mp_rank_XX``, the GLM-4 config and tokenizer beside them) are what
glm-merge puts back into one GLM-4 directory and what every GLM-4 loader reads as it is.
"""

from __future__ import annotations

from glm_port.models.chatglm2.finetune import (IGNORE_INDEX, LORA_DEFAULTS, LORA_TARGET_MODULES, attach_ptuning,
                                               collate, config_of, conversation_of, fingerprint, fit_lengths,
                                               generate, logits, lora_config, prompt_messages, role_conversation,
                                               role_prompt, save, save_base, save_prefix, save_tokenizer)
from glm_port.models.glm4.detect import ARCHITECTURE
from glm_port.models.glm4.ptuning import is_peft_directory
from glm_port.models.glm4.tiny import NAME as EMBEDDED

END_OF_CHAT = "<|user|>"  # finetune_demo's input_ids.append(151336): what closes a training conversation


def message_ids(tokenizer, message: dict) -> list[int]:
    """One message's ids as finetune_demo takes them: the chat template over ``[message]``, its ``[gMASK]<sop>``
    dropped. ``tools`` (bare function dicts, as ChatGLM3's data has them, or ``{"type": "function", ...}``) are
    given to the template as function tools."""
    from glm_port.models.glm4.tokenizer import function_tool

    message = dict(message)
    if "tools" in message:
        message["tools"] = [function_tool(tool) for tool in message["tools"]]
    message.setdefault("metadata", "")
    ids = tokenizer.apply_chat_template([message], tokenize=True, return_dict=False)
    return list(ids)[2:]


def prefix_ids(tokenizer) -> list[int]:
    return [tokenizer.get_command("[gMASK]"), tokenizer.get_command("<sop>")]


def conversation_example(tokenizer, messages, max_source_length: int = 64, max_target_length: int = 128) -> dict:
    """``{"input_ids", "labels"}`` of a conversation as finetune_demo's ``process_batch`` builds it (module
    docstring), unpadded, cut to ``max_source_length + max_target_length + 1``."""
    return role_conversation(messages, prefix_ids(tokenizer), lambda message: message_ids(tokenizer, message),
                             tokenizer.get_command(END_OF_CHAT), max_source_length, max_target_length)


def train_example(tokenizer, content: str, summary: str, max_source_length: int = 64,
                  max_target_length: int = 128) -> dict:
    """``{"input_ids", "labels"}`` of one user turn and one assistant turn."""
    return conversation_example(tokenizer, [{"role": "user", "content": content},
                                            {"role": "assistant", "content": summary}],
                                max_source_length, max_target_length)


def prompt_ids(tokenizer, messages, max_source_length: int = 64) -> list[int]:
    """``[gMASK]<sop>`` + the messages (cut to ``max_source_length``) + ``<|assistant|>``: where a reply starts."""
    return role_prompt(messages, prefix_ids(tokenizer), lambda message: message_ids(tokenizer, message),
                       tokenizer.get_command("<|assistant|>"), max_source_length)


# ---- the binding glm-finetune drives (same names in every family: see glm_port/models/glm/finetune.py) ----


def _tokenizer_at(path):
    """A GLM-4 tokenizer from a directory (its ``tokenizer.model`` or ``tokenizer.json``) or a rank file."""
    from pathlib import Path

    from glm_port.models.glm4.tokenizer import GLM4Tokenizer
    from glm_port.models.glm4.weights import load_tokenizer

    path = Path(path)
    return GLM4Tokenizer(str(path)) if path.is_file() else load_tokenizer(path)


def load(path, device, recompute: bool = False, tokenizer_path=None, pre_seq_len: int | None = None,
         prefix_projection: bool = False, ptuning_checkpoint=None, meta: bool = False):
    """``(model, tokenizer)``: a GLM-4 directory (THUDM's layout or transformers'), or (None) the embedded
    random-init tiny GLM-4; the tokenizer from ``tokenizer_path`` (a directory or a ``tokenizer.model``) when
    given, else the directory's. ``pre_seq_len``, ``prefix_projection``, ``ptuning_checkpoint``: P-Tuning v2 as
    ChatGLM2's binding puts it on (``chatglm2.finetune.attach_ptuning``: a new prefix on the frozen model, or a
    P-Tuning checkpoint's). ``meta``: the same model built on the meta device from the config alone, no weight
    read (fp32; a sharded run's ranks other than 0, filled from rank 0's weights)."""
    import torch

    from glm_port.distributed import tensor_parallel_size

    if path is None:
        if meta:
            from glm_port.models.glm4.tiny import build_tiny

            with torch.device("meta"):
                model, tokenizer = build_tiny()
        else:
            model, tokenizer = _embedded(device)
    elif meta:
        from glm_port.models.glm4.model import GLM4ForCausalLM
        from glm_port.models.glm4.weights import check_directory

        with torch.device("meta"):
            model, tokenizer = GLM4ForCausalLM(check_directory(path)).eval(), None
    elif tensor_parallel_size() > 1:  # each rank reads its slices (Q heads | K, V groups split as ChatGLM2's)
        from glm_port.models.glm4.generation import load_split
        from glm_port.models.glm4.weights import check_directory

        model, tokenizer = load_split(path, check_directory(path), device=device), None
    else:
        from glm_port.models.glm4.weights import load_pretrained

        model = load_pretrained(path, dtype=None, device=device)
        tokenizer = None
    if tokenizer_path is not None:
        tokenizer = _tokenizer_at(tokenizer_path)
    elif tokenizer is None:
        tokenizer = _tokenizer_at(path)
    if len(tokenizer) > model.config.padded_vocab_size:
        raise ValueError(f"the tokenizer gives {len(tokenizer)} ids, more than the model's padded_vocab_size "
                         f"({model.config.padded_vocab_size})")
    if not meta:
        model = model.to(device=device, dtype=next(model.parameters()).dtype)
    # What glm-finetune records of the model (save_pretrained's config.json, and the config its tensor-parallel
    # shards carry) names GLM-4's class, so those shards are GLM-4's with no tokenizer beside them (detect.is_glm4).
    model.config.architectures = [ARCHITECTURE]
    if ptuning_checkpoint is not None and is_peft_directory(ptuning_checkpoint):  # finetune_demo's PEFT prefix
        _attach_peft_prefix(model, pre_seq_len, prefix_projection, ptuning_checkpoint)
    else:
        attach_ptuning(model, pre_seq_len, prefix_projection, ptuning_checkpoint)
    if recompute:  # every GLMBlock checkpointed (transformers' API; its older name before the 5.x rename)
        enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
        enable()
    return model, tokenizer


def _attach_peft_prefix(model, pre_seq_len, prefix_projection, directory) -> None:
    """The prefix of a PEFT prefix-tuning directory (THUDM's GLM-4 finetune_demo's, ``ptuning.read_peft_prefix``)
    put on the frozen model to train on: its embedding as it is, no projection."""
    from glm_port.models import WeightsError
    from glm_port.models.chatglm2.model import attach_prefix
    from glm_port.models.glm4.ptuning import read_peft_prefix

    if prefix_projection:
        raise WeightsError(f"--prefix_projection: {directory} is a PEFT prefix, saved as the prefix's keys and values "
                           f"(no projection)")
    config, state = read_peft_prefix(directory, model.config, pre_seq_len)
    attach_prefix(model, config.pre_seq_len, False, None, {k: v.float() for k, v in state.items()})


def _embedded(device):
    """The embedded tiny GLM-4 and its tokenizer (``chatglm2.finetune.embedded_model``: under tensor parallelism
    each rank's slices of the one model a single process builds)."""
    from glm_port.models.chatglm2.finetune import embedded_model
    from glm_port.models.glm4.model import GLM4ForCausalLM
    from glm_port.models.glm4.tiny import build_tiny

    return embedded_model(build_tiny, GLM4ForCausalLM, device)


def tokenizer_home(path):
    """Where the tokenizer of the model at ``path`` is: its directory."""
    from pathlib import Path

    return Path(path)


def encode(tokenizer, pairs, src_length: int, tgt_length: int, with_targets: bool = True):
    """Each pair (a source and target, a ``history``, or a conversation) in GLM-4's layout (module docstring),
    as glm_port's batch layout: ``text`` the ids, ``target`` the next token at each position, ``loss_mask`` 1 on
    the assistant turns, ``sep`` where the prompt of the last assistant turn ends (after ``<|assistant|>``)."""
    import numpy as np

    from glm_port.training import Encoded

    end = tokenizer.get_command(END_OF_CHAT)
    samples = []
    for pair in pairs:
        messages = conversation_of(pair)
        if with_targets:
            built = conversation_example(tokenizer, messages, src_length, tgt_length)
            ids, labels = built["input_ids"], built["labels"]
            truncated = labels[-1] != end  # the cut fell inside the conversation
            sep = min(len(prompt_ids(tokenizer, prompt_messages(messages), len(ids))), len(ids))
        else:
            ids = prompt_ids(tokenizer, prompt_messages(messages), src_length)
            labels, truncated, sep = [IGNORE_INDEX] * len(ids), False, len(ids)
        target = np.asarray(labels[1:] + [IGNORE_INDEX], dtype=np.int64)
        counted = target != IGNORE_INDEX
        samples.append(Encoded(
            text=np.asarray(ids, dtype=np.int64), position_id=np.arange(len(ids), dtype=np.int64), sep=sep,
            target=np.where(counted, target, 0), loss_mask=counted.astype(np.float32), truncated_target=truncated,
        ))
    return samples


__all__ = ["EMBEDDED", "END_OF_CHAT", "IGNORE_INDEX", "LORA_DEFAULTS", "LORA_TARGET_MODULES", "collate", "config_of",
           "conversation_example", "encode", "fingerprint", "fit_lengths", "generate", "load", "logits",
           "lora_config", "message_ids", "prompt_ids", "save", "save_base", "save_prefix", "save_tokenizer",
           "tokenizer_home", "train_example"]
