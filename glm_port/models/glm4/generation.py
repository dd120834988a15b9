"""GLM-4's side of ``glm-generate`` (``glm_port.generation``): load a directory, continue a batch of prompts.

Prompts are continued as written (``[gMASK]<sop>`` + text, left-padded with ``<|endoftext|>``), until one of the
config's end ids (glm-4-9b-chat: ``<|endoftext|>``, ``<|user|>``, ``<|observation|>``): ChatGLM2's ``generate``
(``glm_port.models.chatglm2.generation``), which reads a list of end ids. For the chat format use ``glm-chat``
or ``model.chat``.
"""

from __future__ import annotations

from glm_port.dtypes import parse_dtype
from glm_port.models.chatglm2.generation import cut_at_stop, generate
from glm_port.models.chatglm2.weights import check_quantize_rows


def check_quantize(path, mode, group_size) -> None:
    """Before any weight is read: a ``WeightsError`` (one line) when ``--quantize int4``'s group size does not
    divide the row of a linear ``Family.quantize`` would replace."""
    from glm_port.models.glm4.weights import check_directory

    if mode == "int4":
        check_quantize_rows(check_directory(path), mode, group_size)


def load(path, *, dtype=None, device=None, tokenizer_type=None, tokenizer_path=None, tensor_parallel=None,
         ptuning_checkpoint=None):
    """``(model, tokenizer)`` from a GLM-4 directory, THUDM's layout or transformers' (``tokenizer_path``: another
    GLM-4 ``tokenizer.model``; without one, the directory's ``tokenizer.model`` or ``tokenizer.json``);
    ``ptuning_checkpoint``: a P-Tuning v2 checkpoint (glm-finetune ``--pre_seq_len``'s output), its prefix put on
    the model (``weights.load_pretrained``)."""
    from glm_port.models.glm4.tokenizer import GLM4Tokenizer
    from glm_port.models.glm4.weights import check_directory, load_pretrained, load_tokenizer

    if tokenizer_type is not None:
        raise ValueError("--tokenizer-type is for GLM vocabularies; GLM-4 reads its tiktoken tokenizer.model")
    if tensor_parallel is not None and getattr(tensor_parallel, "pipeline", None) is not None:
        raise ValueError("the glm4 family does not support pipeline parallelism")
    if tensor_parallel is not None and ptuning_checkpoint is not None:
        raise ValueError("--ptuning_checkpoint: a P-Tuning prefix is not split by tensor parallelism")
    config = check_directory(path, ptuning_checkpoint)  # the prefix's fit too, before a tensor is read
    tokenizer = GLM4Tokenizer(tokenizer_path) if tokenizer_path else load_tokenizer(path)
    if len(tokenizer) > config.padded_vocab_size:
        raise ValueError(f"{path}: the tokenizer gives {len(tokenizer)} ids, more than the model's padded_vocab_size "
                         f"({config.padded_vocab_size})")
    if tensor_parallel is not None:
        return load_split(path, config, parse_dtype(dtype), device or "cpu"), tokenizer
    return load_pretrained(path, dtype=parse_dtype(dtype), device=device or "cpu",
                           ptuning_checkpoint=ptuning_checkpoint), tokenizer


def load_split(path, config, dtype=None, device="cpu"):
    """The model built under the current tensor-parallel layout, each rank copying its slices of each tensor as it
    is read (ChatGLM2's split rules: ``chatglm2.weights.load_tensor_parallel``), from either layout."""
    from glm_port.models.chatglm2.weights import default_dtype, load_tensor_parallel
    from glm_port.models.glm4.model import GLM4ForCausalLM
    from glm_port.models.glm4.weights import open_weights

    model = GLM4ForCausalLM(config)
    load_tensor_parallel(model, open_weights(path, config))
    return model.to(device=device, dtype=dtype or default_dtype(device)).eval()


__all__ = ["check_quantize", "cut_at_stop", "generate", "load", "load_split"]
