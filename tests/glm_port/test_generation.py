"""GLM generation: the cached forward against GLMModel and against uncached decoding, beam search against an
exhaustive search, blank filling against upstream's generate_samples loop (mems), GenerationMixin's options."""

import itertools

import pytest
import torch

from glm_port import GLMModel
from glm_port.data.tokenization import tiny_wordpiece
from glm_port.models.glm.blanks import fill_blanks
from glm_port.models.glm.hf import GLMForConditionalGeneration, GLMPretrainedConfig
from glm_port.models.glm.tokenizer import GLMTokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return GLMTokenizer(tiny_wordpiece())


def tiny_model(vocab_size, seed=0, std=0.3, layers=2, hidden=64, heads=4, positions=64):
    """Random weights wide enough that greedy decoding does not repeat one token."""
    torch.manual_seed(seed)
    config = GLMPretrainedConfig(num_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                                 vocab_size=vocab_size, max_sequence_length=positions, initializer_range=std)
    return GLMForConditionalGeneration(config).eval()


@pytest.fixture(scope="module")
def model(tokenizer):
    return tiny_model(tokenizer.vocab_size)


TEXTS = ["the cat sat on the [MASK] and looked at it", "a short one"]


def test_forward_matches_glm_model_with_sep_mask(model):
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    positions = torch.stack((torch.arange(9).expand(2, 9), torch.tensor([[0] * 6 + [1, 2, 3]] * 2)), dim=1)
    sep = torch.tensor([6, 4])
    ours = model(ids, position_ids=positions, attention_mask=sep).logits
    (reference,) = GLMModel.forward(model.glm, ids, positions, sep)
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-5)


def test_cached_steps_equal_one_uncached_forward(model, tokenizer):
    inputs = tokenizer.build_inputs_for_generation(TEXTS, max_gen_length=8)
    full = model.generate(**inputs, max_new_tokens=6, min_new_tokens=6, do_sample=False,
                          eos_token_id=[tokenizer.eop_token_id], pad_token_id=tokenizer.pad_token_id)
    length = full.size(1)
    mask = inputs.generation_attention_mask[:, :, :length, :length]
    whole = model(full, position_ids=inputs.position_ids[:, :, :length], attention_mask=mask).logits
    # Step by step through the cache: each step feeds only the new token.
    from transformers.cache_utils import DynamicCache

    cache, start = DynamicCache(), inputs.input_ids.size(1)
    steps = [model(full[:, :start], position_ids=inputs.position_ids[:, :, :start],
                   attention_mask=mask[:, :, :start, :start], cache=cache, use_cache=True).logits]
    for i in range(start, length):
        steps.append(model(full[:, i:i + 1], position_ids=inputs.position_ids[:, :, i:i + 1],
                           attention_mask=mask[:, :, i:i + 1, :i + 1], cache=cache, use_cache=True).logits)
    assert cache.get_seq_length() == length
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, rtol=1e-5, atol=1e-5)


def test_greedy_cached_equals_recompute(model, tokenizer):
    inputs = tokenizer.build_inputs_for_generation(TEXTS, max_gen_length=12)
    kwargs = dict(max_new_tokens=10, do_sample=False, eos_token_id=[tokenizer.eop_token_id],
                  pad_token_id=tokenizer.pad_token_id, output_scores=True, return_dict_in_generate=True)
    cached = model.generate(**inputs, use_cache=True, **kwargs)
    recomputed = model.generate(**inputs, use_cache=False, **kwargs)
    assert torch.equal(cached.sequences, recomputed.sequences)
    assert len(set(cached.sequences[0, inputs.input_ids.size(1):].tolist())) > 2  # not a degenerate repeat
    for a, b in zip(cached.scores, recomputed.scores):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_static_cache_equals_dynamic_cache(model, tokenizer):
    inputs = tokenizer.build_inputs_for_generation(TEXTS, max_gen_length=10)
    kwargs = dict(max_new_tokens=8, do_sample=False, eos_token_id=[tokenizer.eop_token_id],
                  pad_token_id=tokenizer.pad_token_id, output_scores=True, return_dict_in_generate=True)
    dynamic = model.generate(**inputs, **kwargs)
    static = model.generate(**inputs, cache_implementation="static", **kwargs)
    assert torch.equal(dynamic.sequences, static.sequences)
    for a, b in zip(dynamic.scores, static.scores):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_compiled_static_decode_step_generates_the_eager_tokens(model, tokenizer):
    # The decode step compiled whole (fullgraph: no graph break, no read of the cache's length on the host),
    # by inductor's CPU backend here, as CUDA graphs replay it on a GPU (bench.generate --variants compiled).
    from transformers import CompileConfig

    inputs = tokenizer.build_inputs_for_generation(TEXTS, max_gen_length=6)
    kwargs = dict(max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=tokenizer.pad_token_id,
                  cache_implementation="static")
    config = CompileConfig(fullgraph=True, dynamic=False)
    config._compile_all_devices = True  # transformers compiles on CUDA only unless told
    eager = model.generate(**inputs, **kwargs)
    compiled = model.generate(**inputs, compile_config=config, **kwargs)
    assert getattr(model, "_compiled_call", None) is not None
    assert torch.equal(compiled, eager)


def test_beam_search_equals_exhaustive_search():
    vocab, steps = 5, 3
    model = tiny_model(vocab, seed=3, std=0.5, hidden=32, layers=1)
    prompt = torch.tensor([[1, 2, 3, 0]])
    s = prompt.size(1)
    positions = torch.stack((torch.arange(s + steps + 1), torch.tensor([0] * s + list(range(1, steps + 2)))))
    mask = torch.ones(1, 1, s + steps + 1, s + steps + 1).tril().bool()
    mask[..., :s] = True
    inputs = dict(input_ids=prompt, position_ids=positions.unsqueeze(0), generation_attention_mask=mask)
    out = model.generate(**inputs, max_new_tokens=steps, num_beams=vocab ** (steps - 1), do_sample=False,
                         eos_token_id=None, pad_token_id=0, length_penalty=0.0, early_stopping=True)
    best, best_score = None, -float("inf")
    for tail in itertools.product(range(vocab), repeat=steps):
        seq = torch.cat((prompt, torch.tensor([tail])), dim=1)
        n = seq.size(1)
        logp = model(seq, position_ids=inputs["position_ids"][:, :, :n],
                     attention_mask=mask[:, :, :n, :n]).logits.log_softmax(-1)
        score = sum(logp[0, s - 1 + i, tail[i]].item() for i in range(steps))
        if score > best_score:
            best, best_score = tail, score
    assert out[0, s:].tolist() == list(best)


def test_generation_options_reach_generation_mixin(model, tokenizer):
    inputs = tokenizer.build_inputs_for_generation(TEXTS[:1], max_gen_length=16)
    base = dict(max_new_tokens=12, pad_token_id=tokenizer.pad_token_id, eos_token_id=[tokenizer.eop_token_id])
    out = model.generate(**inputs, no_repeat_ngram_size=1, **base)[0, inputs.input_ids.size(1):].tolist()
    out = [t for t in out if t != tokenizer.pad_token_id]
    assert len(out) == len(set(out))
    beams = model.generate(**inputs, num_beams=4, num_return_sequences=3, **base)
    assert beams.size(0) == 3
    sampled = []
    for seed in (5, 5, 6):
        torch.manual_seed(seed)
        sampled.append(model.generate(**inputs, do_sample=True, top_k=20, top_p=0.9, temperature=0.8, **base))
    assert torch.equal(sampled[0], sampled[1]) and not torch.equal(sampled[0], sampled[2])


def test_eop_stops_and_min_length(tokenizer):
    model = tiny_model(tokenizer.vocab_size, seed=1)
    with torch.no_grad():  # make eop the likeliest token everywhere: the first step must end the blank
        model.glm.word_embeddings.weight[tokenizer.eop_token_id] = model.glm.transformer.final_layernorm.bias + 50.0
        model.glm.transformer.final_layernorm.weight.fill_(0.0)
        model.glm.transformer.final_layernorm.bias.fill_(1.0)
    inputs = tokenizer.build_inputs_for_generation(TEXTS[:1], max_gen_length=10)
    stops = dict(eos_token_id=[tokenizer.eop_token_id], pad_token_id=tokenizer.pad_token_id, max_new_tokens=8)
    assert model.generate(**inputs, **stops)[0, -1].item() == tokenizer.eop_token_id
    assert model.generate(**inputs, **stops).size(1) == inputs.input_ids.size(1) + 1
    longer = model.generate(**inputs, min_new_tokens=4, **stops)
    assert longer.size(1) == inputs.input_ids.size(1) + 5


def upstream_fill(glm, tokenizer, text, max_new_tokens):
    """Upstream generate_samples.py's greedy loop, on GLMModel with mems: prefill, then per blank feed sop
    and each token with sep 0 and position (blank, counter + 1), stop at eop/eos (not fed back).

    One deliberate difference: a span cut at max_new_tokens has its last token fed too, so later blanks
    see every token of the text (upstream leaves that token out of mems; docs/generation.md)."""
    ids = tokenizer.encode(tokenizer.with_blank(text))
    tokens = torch.tensor([ids])
    n = len(ids)
    positions = torch.stack((torch.arange(n), torch.zeros(n, dtype=torch.long))).unsqueeze(0)
    _, *mems = glm(tokens, positions, torch.tensor([n]), return_memory=True)
    spans = []
    for blank in [p for p, i in enumerate(ids) if i in tokenizer.mask_token_ids]:
        last, span = tokenizer.sop_token_id, []
        for counter in range(max_new_tokens + 1):
            pos = torch.tensor([[[blank], [counter + 1]]])
            logits, *mems = glm(torch.tensor([[last]]), pos, torch.tensor([0]), *mems, return_memory=True)
            last = logits[0, -1].argmax().item()
            if last in (tokenizer.eop_token_id, tokenizer.eos_token_id) or counter == max_new_tokens:
                break
            span.append(last)
        spans.append(span)
    return spans


@pytest.mark.parametrize("text", [
    "the [MASK] sat on the mat and the [MASK] ran away",
    "one [MASK] two [sMASK] three",
    "no blank here",
])
def test_blank_filling_matches_upstreams_loop(model, tokenizer, text):
    (filled,) = fill_blanks(model, tokenizer, [text], max_new_tokens=6)
    assert filled.spans == upstream_fill(model.glm, tokenizer, text, 6)
    assert len(filled.spans) == max(1, text.count("MASK]"))


def test_batched_single_blanks_equal_one_by_one(model, tokenizer):
    texts = ["the cat sat on the [MASK] today", "hello [MASK]", "a much longer sentence with [MASK] in it"]
    batched = fill_blanks(model, tokenizer, texts, max_new_tokens=6)
    alone = [fill_blanks(model, tokenizer, [t], max_new_tokens=6)[0] for t in texts]
    assert [f.spans for f in batched] == [f.spans for f in alone]
    assert [f.spans for f in batched] == [upstream_fill(model.glm, tokenizer, t, 6) for t in texts]


def test_filled_text_forms(model, tokenizer):
    (filled,) = fill_blanks(model, tokenizer, ["the [MASK] sat"], max_new_tokens=3)
    span = tokenizer.decode(filled.spans[0])
    assert filled.text == tokenizer.decode(tokenizer.vocab.encode("the") + filled.spans[0]
                                           + tokenizer.vocab.encode("sat"))
    assert filled.marked.startswith("[CLS] the [MASK] sat")
    assert "<|startofpiece|>" in filled.marked and filled.marked.endswith("<|endofpiece|>")
    assert span in filled.marked


def test_prompt_longer_than_positions_is_one_error(tokenizer):
    model = tiny_model(tokenizer.vocab_size, positions=8)
    with pytest.raises(ValueError, match="longer than the model's 8 positions"):
        fill_blanks(model, tokenizer, ["a b c d e f g h i j [MASK]"], max_new_tokens=2)


def test_packed_linears_fill_the_same_blanks(tokenizer):
    """glm-generate packs the linears on CPU (shim.nn.pack_linears): same logits and greedy fills."""
    from shim.nn import PackedLinear, pack_linears

    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")
    model = tiny_model(tokenizer.vocab_size, seed=3)
    texts = ["the cat sat on the [MASK] and looked at it", "[MASK] a short one [sMASK]"]
    inputs = tokenizer.build_inputs_for_generation(texts, max_gen_length=8)
    with torch.inference_mode():
        want = fill_blanks(model, tokenizer, texts, max_new_tokens=6)
        logits = model(inputs.input_ids, position_ids=inputs.position_ids[:, :, :inputs.input_ids.size(1)]).logits
        assert pack_linears(model, measure=False) == 4 * 2  # qkv, dense, h_to_4h, 4h_to_h per layer
        assert isinstance(model.glm.transformer.layers[0].attention.query_key_value, PackedLinear)
        got = fill_blanks(model, tokenizer, texts, max_new_tokens=6)
        again = model(inputs.input_ids, position_ids=inputs.position_ids[:, :, :inputs.input_ids.size(1)]).logits
    torch.testing.assert_close(again, logits, atol=1e-5, rtol=1e-5)
    assert got == want


# ---- stop tokens and length penalty under a scripted model (issue 26) ------------------------------------


class Scripted:
    """A logits processor that sets every next token by the last one: ``table[last]`` maps tokens to their
    log-probabilities (a last token not in the table: ``default``); every other token gets -1e4."""

    def __init__(self, table: dict, default: dict):
        self.table, self.default = table, default

    def __call__(self, input_ids, scores):
        out = torch.full_like(scores, -1e4)
        for row, last in enumerate(input_ids[:, -1].tolist()):
            for token, logp in self.table.get(last, self.default).items():
                out[row, token] = logp
        return out


def _scripted(table, default):
    from transformers import LogitsProcessorList

    return LogitsProcessorList([Scripted(table, default)])


@pytest.mark.parametrize("stop", ["eop", "eos"])
def test_filled_spans_end_before_a_forced_stop_token(model, tokenizer, stop):
    """sop -> A -> B -> stop -> C...: each blank (batched single blanks, and the two blanks of one text) is
    [A, B]: generation stops at eop and at eos, and the stop token is not part of the span."""
    from glm_port.models.glm.generation import generate

    a, b, c = tokenizer.vocab.encode("cat dog mat")[:3]
    end = getattr(tokenizer, f"{stop}_token_id")
    script = _scripted({tokenizer.sop_token_id: {a: 0.0}, a: {b: 0.0}, b: {end: 0.0}, end: {c: 0.0}}, {c: 0.0})
    texts = ["the [MASK] sat", "a much longer text with a [MASK] in it", "one [MASK] two [sMASK] three"]
    for num_beams in (1, 2):
        results = generate(model, tokenizer, texts, max_new_tokens=6, num_beams=num_beams, logits_processor=script)
        assert [r["generated_ids"] for r in results] == [[[a, b]], [[a, b]], [[a, b], [a, b]]], num_beams
        assert results[0]["text"] == tokenizer.decode(tokenizer.vocab.encode("the") + [a, b]
                                                      + tokenizer.vocab.encode("sat"))


@pytest.mark.parametrize("stop", ["eop", "eos"])
def test_finetune_predictions_end_before_a_forced_stop_token(model, tokenizer, stop):
    """glm-finetune's evaluation (the GLM binding's generate) cuts each prediction at eop / eos."""
    from glm_port.finetune.datasets import Pair
    from glm_port.models.glm import finetune

    a, b, c = tokenizer.vocab.encode("cat dog mat")[:3]
    end = getattr(tokenizer, f"{stop}_token_id")
    script = _scripted({tokenizer.sop_token_id: {a: 0.0}, a: {b: 0.0}, b: {end: 0.0}, end: {c: 0.0}}, {c: 0.0})
    samples = finetune.encode(tokenizer.vocab, [Pair("the cat", ""), Pair("a dog sat on a mat", "")], 16, 8,
                              with_targets=False)
    search = dict(max_new_tokens=6, num_beams=1, do_sample=False, logits_processor=script)
    assert finetune.generate(model.glm, tokenizer.vocab, samples, search, 2, "cpu") == [tokenizer.decode([a, b])] * 2


def test_length_penalty_picks_between_beams_that_end_at_different_lengths(model, tokenizer):
    """Two beams: sop A eop (log-prob -1.5 over 2 tokens) and sop B C D E eop (-1.9 over 5). Summed (length
    penalty 0) the short one wins; divided by length (1.0) the long one. fill_blanks passes it to generate."""
    from glm_port.models.glm.blanks import fill_blanks

    a, b, c, d, e = tokenizer.vocab.encode("cat dog mat sat ran")[:5]
    eop = tokenizer.eop_token_id
    script = _scripted({tokenizer.sop_token_id: {a: -1.0, b: -1.5}, a: {eop: -0.5}, b: {c: -0.1}, c: {d: -0.1},
                        d: {e: -0.1}, e: {eop: -0.1}}, {eop: 0.0})
    spans = {}
    for penalty in (0.0, 1.0):
        (filled,) = fill_blanks(model, tokenizer, ["the [MASK] here"], max_new_tokens=8, num_beams=2,
                                length_penalty=penalty, logits_processor=script)
        spans[penalty] = filled.spans
    assert spans == {0.0: [[a]], 1.0: [[b, c, d, e]]}


def test_num_return_sequences_rows_belong_to_their_prompt(model, tokenizer):
    """generate returns each prompt's n sequences in a row: result k of prompt i is row i * n + k."""
    texts = ["the cat sat on the [MASK] today", "hello [MASK]", "a much longer sentence with [MASK] in it"]
    batched = fill_blanks(model, tokenizer, texts, max_new_tokens=5, num_beams=3, num_return_sequences=3)
    alone = [f for t in texts for f in fill_blanks(model, tokenizer, [t], max_new_tokens=5, num_beams=3,
                                                   num_return_sequences=3)]
    assert [(f.prompt, f.sequence) for f in batched] == [(t, k) for t in texts for k in range(3)]
    assert [f.spans for f in batched] == [f.spans for f in alone]
    assert len({tuple(map(tuple, f.spans)) for f in batched}) > 3  # the prompts' sequences differ
