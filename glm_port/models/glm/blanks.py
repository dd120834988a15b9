"""Blank filling: every ``[MASK]``/``[sMASK]``/``[gMASK]`` of a text filled left to right, as upstream's
``generate_samples.py`` does, each blank one ``model.generate`` call.

After a blank is filled its tokens stay in the sequence (and, for greedy and sampling, in the KV cache),
so the next blank's ``sop`` attends to the prompt and every span filled before it; the end token
(``eop``/``eos``) is dropped, as upstream never feeds it back. Texts with one blank go through
``generate`` as one padded batch; a text with several blanks is filled on its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from transformers.cache_utils import DynamicCache

import shim as torch
from glm_port.models.glm.tokenizer import GLMTokenizer, generation_mask


@dataclass
class Filled:
    """One filled text: ``spans`` holds the ids generated for each blank (sop/eop excluded)."""

    prompt: str
    prompt_ids: list[int]
    spans: list[list[int]] = field(default_factory=list)
    text: str = ""  # the plain sentence with every blank filled
    marked: str = ""  # LiBai's form: the prompt, then <|startofpiece|> span <|endofpiece|> per blank
    sequence: int = 0  # which of num_return_sequences

    @property
    def generated_tokens(self) -> int:
        return sum(len(s) for s in self.spans)


def fill_blanks(model, tokenizer: GLMTokenizer, texts: list[str], *, max_new_tokens: int = 64,
                **generate_kwargs) -> list[Filled]:
    """Fill every blank of each text; ``generate_kwargs`` go to ``model.generate`` (do_sample, num_beams...).

    With ``num_return_sequences`` n > 1 (single-blank texts only) each text gives n results in a row.
    """
    stops = [tokenizer.eop_token_id, tokenizer.eos_token_id]
    generate_kwargs = {"eos_token_id": stops, "pad_token_id": tokenizer.pad_token_id, **generate_kwargs}
    generate_kwargs.setdefault("do_sample", False)
    limit = getattr(model.config, "max_sequence_length", None)
    encoded = [tokenizer.encode(tokenizer.with_blank(t)) for t in texts]
    for text, ids in zip(texts, encoded):
        if limit is not None and len(ids) + 1 > limit:
            raise ValueError(f"prompt of {len(ids) + 1} tokens (with sop) is longer than the model's {limit} "
                             f"positions: {text[:50]!r}")
    if limit is not None and getattr(model.config, "block_position_encoding", True) and max_new_tokens + 1 > limit:
        # a blank's sop and tokens take block positions 1..max_new_tokens + 1 (upstream does not cut them short)
        raise ValueError(f"max_new_tokens {max_new_tokens}: a blank's tokens take block positions "
                         f"1..{max_new_tokens + 1}, past the model's {limit} positions (at most {limit - 1} new "
                         f"tokens per blank)")
    blank_counts = [sum(1 for i in ids if i in tokenizer.mask_token_ids) for ids in encoded]
    returns = generate_kwargs.get("num_return_sequences", 1)
    if returns > 1 and max(blank_counts) > 1:
        raise ValueError("num_return_sequences > 1 needs texts with a single blank")
    results: list[Filled | None] = [None] * len(texts)
    single = [i for i, n in enumerate(blank_counts) if n == 1]
    if single:
        for i, fills in zip(single, _fill_single_batch(model, tokenizer, [texts[i] for i in single],
                                                       max_new_tokens, generate_kwargs)):
            results[i] = fills
    for i, n in enumerate(blank_counts):
        if n > 1:
            results[i] = [_fill_one(model, tokenizer, texts[i], encoded[i], max_new_tokens, generate_kwargs)]
    return [f for group in results for f in group]


def _cut(ids: list[int], stops) -> tuple[list[int], bool]:
    for k, i in enumerate(ids):
        if i in stops:
            return ids[:k], True
    return ids, False


def _fill_single_batch(model, tokenizer, texts, max_new_tokens, kwargs) -> list[list[Filled]]:
    inputs = tokenizer.build_inputs_for_generation(texts, max_gen_length=max_new_tokens + 1).to(model.device)
    start = inputs.input_ids.size(1)
    out = model.generate(input_ids=inputs.input_ids, position_ids=inputs.position_ids,
                         generation_attention_mask=inputs.generation_attention_mask,
                         attention_mask=inputs.attention_mask, max_new_tokens=max_new_tokens, **kwargs)
    returns = kwargs.get("num_return_sequences", 1)
    stops = kwargs["eos_token_id"]
    grouped = []
    for row, text in enumerate(texts):
        prompt_ids = inputs.input_ids[row, :start - 1][inputs.attention_mask[row, :start - 1].bool()].tolist()
        fills = []
        for k in range(returns):
            span, _ = _cut(out[row * returns + k, start:].tolist(), stops)
            fills.append(_finish(tokenizer, text, prompt_ids, [span], sequence=k))
        grouped.append(fills)
    return grouped


def _fill_one(model, tokenizer, text, prompt_ids, max_new_tokens, kwargs) -> Filled:
    """Several blanks of one text, left to right, the cache carried over between them (greedy/sampling)."""
    device = model.device
    blanks = [p for p, i in enumerate(prompt_ids) if i in tokenizer.mask_token_ids]
    prompt_length = len(prompt_ids)
    stops = kwargs["eos_token_id"]
    reuse_cache = kwargs.get("num_beams", 1) == 1 and kwargs.get("use_cache", True) and \
        kwargs.get("cache_implementation") is None
    cache = DynamicCache() if reuse_cache else None
    sequence = list(prompt_ids)
    positions = torch.stack((torch.arange(prompt_length), torch.zeros(prompt_length, dtype=torch.long)))
    spans = []
    for blank in blanks:
        sequence.append(tokenizer.sop_token_id)
        length = len(sequence)
        block = torch.stack((torch.full((max_new_tokens + 1,), blank, dtype=torch.long),
                             torch.arange(1, max_new_tokens + 2)))
        position_ids = torch.cat((positions, block), dim=1).unsqueeze(0)
        total = position_ids.size(-1)
        mask = generation_mask(torch.ones(1, length, dtype=torch.bool), prompt_length, total)
        step_kwargs = dict(kwargs)
        if cache is not None:
            step_kwargs["cache"] = cache
        out = model.generate(input_ids=torch.tensor([sequence], device=device), position_ids=position_ids.to(device),
                             generation_attention_mask=mask.to(device),
                             attention_mask=torch.ones(1, length, dtype=torch.long, device=device),
                             max_new_tokens=max_new_tokens, **step_kwargs)
        span, _ = _cut(out[0, length:].tolist(), stops)
        spans.append(span)
        sequence += span
        positions = position_ids[0, :, :len(sequence)]
    return _finish(tokenizer, text, prompt_ids, spans)


def _finish(tokenizer: GLMTokenizer, text, prompt_ids, spans, sequence: int = 0) -> Filled:
    # the prompt's closing eos is left out: it is [PAD] in BERT's vocabulary (pad = eos), and no part of the text
    marked = [i for i in prompt_ids if i != tokenizer.eos_token_id]
    for span in spans:
        marked += [tokenizer.sop_token_id, *span, tokenizer.eop_token_id]
    plain, queue = [], list(spans)
    for i in prompt_ids:
        if i in tokenizer.mask_token_ids and queue:
            plain += queue.pop(0)
        elif i not in (tokenizer.cls_token_id, tokenizer.eos_token_id):
            plain.append(i)
    return Filled(prompt=text, prompt_ids=list(prompt_ids), spans=spans, text=tokenizer.decode(plain).strip(),
                  marked=tokenizer.decode(marked), sequence=sequence)
