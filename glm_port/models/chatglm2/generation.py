"""ChatGLM2's side of ``glm-generate`` (``glm_port.generation``): load a directory, continue a batch of prompts.

Prompts are continued as written (``[gMASK] sop`` + text, left-padded batches, ``generate`` until ``</s>``);
for the chat format use ``glm-chat`` or ``model.chat``.
"""

from __future__ import annotations

from glm_port.dtypes import parse_dtype
from glm_port.models.chatglm2.weights import check_quantize  # noqa: F401  (glm-generate's, before loading)


def load(path, *, dtype=None, device=None, tokenizer_type=None, tokenizer_path=None, tensor_parallel=None,
         ptuning_checkpoint=None):
    """``(model, tokenizer)`` from a ChatGLM2 directory (``tokenizer_path``: another ``tokenizer.model``;
    ``ptuning_checkpoint``: THUDM P-Tuning v2's output directory, its prefix put on the model)."""
    from glm_port.models.chatglm2.tokenizer import ChatGLM2Tokenizer
    from glm_port.models.chatglm2.weights import check_directory, load_pretrained, load_tokenizer

    if tokenizer_type is not None:
        raise ValueError("--tokenizer-type is for GLM vocabularies; ChatGLM2 reads its tokenizer.model")
    config = check_directory(path, quantized=True, ptuning_checkpoint=ptuning_checkpoint)
    tokenizer = ChatGLM2Tokenizer(tokenizer_path) if tokenizer_path else load_tokenizer(path)
    if tokenizer.vocab_size > config.padded_vocab_size:
        raise ValueError(f"{path}: the tokenizer gives {tokenizer.vocab_size} ids, more than the model's "
                         f"padded_vocab_size ({config.padded_vocab_size})")
    if tensor_parallel is not None and config.quantization_bit:
        raise ValueError(f"{path}: a quantization_bit={config.quantization_bit} checkpoint is not split by tensor "
                         f"parallelism")
    if tensor_parallel is not None and ptuning_checkpoint is not None:
        raise ValueError("--ptuning_checkpoint: a P-Tuning prefix is not split by tensor parallelism")
    if tensor_parallel is None:
        return load_pretrained(path, dtype=parse_dtype(dtype), device=device or "cpu",
                               ptuning_checkpoint=ptuning_checkpoint), tokenizer
    return load_split(path, config, parse_dtype(dtype), device or "cpu"), tokenizer


def load_split(path, config, dtype=None, device="cpu"):
    """The model built under the current tensor-parallel layout, each rank reading its slices of the weights
    one tensor at a time (``weights.tensor_parallel_slice``). A size larger than the key/value group count
    (a multiple of it) gives each rank a copy of its heads' group; other sizes are a one-line ValueError."""
    from glm_port.models.chatglm2.model import ChatGLM2ForCausalLM
    from glm_port.models.chatglm2.weights import default_dtype, load_tensor_parallel, open_weights

    model = ChatGLM2ForCausalLM(config)
    load_tensor_parallel(model, open_weights(path))
    return model.to(device=device, dtype=dtype or default_dtype(device)).eval()


def cut_at_stop(tokenizer, ids: list[int], stops) -> tuple[list[int], str]:
    """``(ids up to the token that completes the first stop string, the text before that string)``."""
    for k in range(1, len(ids) + 1):
        text = tokenizer.decode(ids[:k])
        cuts = [i for i in (text.find(stop) for stop in stops) if i >= 0]
        if cuts:
            return ids[:k], text[:min(cuts)]
    return ids, tokenizer.decode(ids)


def generate(model, tokenizer, prompts: list[str], *, max_new_tokens: int = 64, batch_size: int = 8,
             **generate_kwargs) -> list[dict]:
    """One result per prompt (per returned sequence): ``prompt``, ``text`` (prompt + continuation),
    ``generated_ids`` (one span: the new tokens before ``</s>``, or before the first of the config's end ids when it
    lists several, as GLM-4's does), ``marked``, ``sequence``."""
    eos, pad = model.config.eos_token_id, model.config.pad_token_id
    ends = set(eos) if isinstance(eos, (list, tuple)) else {eos}
    generate_kwargs.setdefault("eos_token_id", eos)
    generate_kwargs.setdefault("pad_token_id", pad)
    stops = list(generate_kwargs.get("stop_strings") or [])
    if stops:  # transformers' StopStringCriteria stops each row once its text holds one; cut there below
        generate_kwargs["tokenizer"] = tokenizer
    batches, limit = [], model.config.seq_length
    for start in range(0, len(prompts), batch_size):  # every batch checked before any is generated
        batch = prompts[start:start + batch_size]
        inputs = tokenizer(batch, return_tensors="pt", padding=True)
        length = inputs["input_ids"].shape[1]
        if length + 1 > limit:
            raise ValueError(f"prompt of {length} tokens does not fit the model's seq_length ({limit})")
        room = limit - length  # max_new_tokens is cut to it, as THUDM's chat cuts max_length to seq_length
        if generate_kwargs.get("min_new_tokens", 0) > room:
            raise ValueError(f"min_new_tokens {generate_kwargs['min_new_tokens']}: a prompt of {length} tokens leaves "
                             f"room for {room} new tokens in the model's seq_length ({limit})")
        batches.append((batch, inputs, length, room))
    results = []
    for batch, inputs, length, room in batches:
        inputs = inputs.to(model.device)
        output = model.generate(**inputs, max_new_tokens=min(max_new_tokens, room), **generate_kwargs)
        per_prompt = output.shape[0] // len(batch)
        for row, sequence in enumerate(output.tolist()):
            prompt = batch[row // per_prompt]
            new = sequence[length:]
            new = next((new[:i] for i, token in enumerate(new) if token in ends), new)
            completion = tokenizer.decode(new)
            if stops and any(stop in completion for stop in stops):
                new, completion = cut_at_stop(tokenizer, new, stops)
            padding = int((inputs["attention_mask"][row // per_prompt] == 0).sum())  # left padding
            ids = sequence[padding:]
            results.append({"prompt": prompt, "text": prompt + completion, "generated_ids": [new],
                            "marked": f"{prompt}<|startofpiece|>{completion}<|endofpiece|>", "sequence": ids})
    return results
