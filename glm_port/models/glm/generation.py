"""GLM's side of ``glm-generate`` (``glm_port.generation``): load a model and its tokenizer from any GLM
weights, fill the blanks of a batch of prompts."""

from __future__ import annotations

from pathlib import Path

from glm_port.models.glm.blanks import fill_blanks
from glm_port.models.glm.hf import GLMForConditionalGeneration
from glm_port.models.glm.tokenizer import GLMTokenizer


def load(path, *, dtype=None, device=None, tokenizer_type=None, tokenizer_path=None, tensor_parallel=None):
    """``(model, tokenizer)`` for ``path``: a HF GLM directory, upstream mp_rank files, a glm-pretrain save."""
    model = GLMForConditionalGeneration.from_pretrained(path, dtype=dtype, device=device,
                                                       tensor_parallel=tensor_parallel)
    note = _check_tokenizer_beside(path) if tokenizer_type is None and tokenizer_path is None else None
    tokenizer = load_tokenizer(path, tokenizer_type, tokenizer_path)
    if tokenizer.vocab.num_tokens > model.config.vocab_size:
        raise ValueError(f"the {tokenizer.vocab.name} vocabulary has {tokenizer.vocab.num_tokens} tokens, more than "
                         f"the model's {model.config.vocab_size}: pass the tokenizer it was trained with "
                         f"(--tokenizer-type/--tokenizer-path)")
    tokenizer.load_note = note  # glm-generate prints it (one line) with its results
    return model, tokenizer


def _check_tokenizer_beside(path) -> str | None:
    """With no tokenizer named and none beside the weights: a Hugging Face directory (``config.json`` + weights)
    is refused in one line, as transformers' ``AutoTokenizer`` refuses one without tokenizer files (its
    vocabulary is unknown, and the built-in one would generate nonsense); glm-pretrain's saves and upstream's
    ``mp_rank_XX`` checkpoints, which hold no vocabulary by design, get glm-pretrain's default, the built-in
    vocabulary: the note returned says so (None: the directory has its tokenizer)."""
    from glm_port.data.tokenization import DEFAULT_TOKENIZER
    from glm_port.models.glm.weights import find_source

    path = Path(path)
    directory = path if path.is_dir() else path.parent
    try:
        GLMTokenizer.from_pretrained(directory)
        return None
    except FileNotFoundError:
        pass
    if find_source(path).kind == "hf":
        raise ValueError(f"{path}: no tokenizer beside the weights (no vocabulary file or tokenizer_config.json): "
                         f"name it with --tokenizer-path (and --tokenizer-type)")
    return (f"{path} holds no tokenizer: used the built-in {DEFAULT_TOKENIZER} (glm-pretrain's default); name "
            f"another with --tokenizer-type / --tokenizer-path")


def load_tokenizer(path, tokenizer_type=None, tokenizer_path=None) -> GLMTokenizer:
    """The tokenizer named by the flags, else the vocabulary beside the weights, else glm-pretrain's built-in
    default (a ``glm-pretrain --save`` directory holds no vocabulary)."""
    from glm_port.data.tokenization import get_tokenizer

    if tokenizer_path is not None:
        return GLMTokenizer.from_pretrained(tokenizer_path, tokenizer_type)
    if tokenizer_type is not None:
        return GLMTokenizer(get_tokenizer(tokenizer_type))
    path = Path(path)
    directory = path if path.is_dir() else path.parent
    try:
        return GLMTokenizer.from_pretrained(directory)
    except FileNotFoundError:
        return GLMTokenizer(get_tokenizer(None))


def generate(model, tokenizer: GLMTokenizer, prompts: list[str], *, max_new_tokens: int = 64, batch_size: int = 8,
             **generate_kwargs) -> list[dict]:
    """One result per prompt (per returned sequence): ``prompt``, ``text`` (the filled sentence),
    ``generated_ids`` (per blank, sop/eop excluded), ``marked`` (LiBai's form), ``sequence``."""
    if generate_kwargs.get("stop_strings"):
        raise ValueError("--stop: GLM's blank filling takes no stop strings (each blank ends at its eop)")
    results = []
    for start in range(0, len(prompts), batch_size):
        for filled in fill_blanks(model, tokenizer, prompts[start:start + batch_size], max_new_tokens=max_new_tokens,
                                  **generate_kwargs):
            results.append({"prompt": filled.prompt, "text": filled.text, "generated_ids": filled.spans,
                            "marked": filled.marked, "sequence": filled.sequence})
    return results
