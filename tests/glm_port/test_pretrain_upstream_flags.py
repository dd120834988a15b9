"""glm-pretrain's upstream flags beyond the model: validation and test, the data knobs, naming and bookkeeping,
TensorBoard, named corpora, fp16 loss scaling. Each knob is checked for what it changes."""

from __future__ import annotations

import math
import re
from datetime import datetime

import numpy as np
import pytest
import torch

from glm_port.arguments import parse_args
from glm_port.data import get_tokenizer, load_corpus
from glm_port.data.batches import (DataOptions, Windows, corpus_splits, english_documents, parse_split,
                                   scatter_documents, split_documents, take_documents)
from glm_port.data.corpora import resolve_corpus
from glm_port.distributed import ParallelEnv
from glm_port.pretrain_glm import build_data, eval_lines, experiment_save_dir, main, masker_kwargs
from glm_port.training import Precision

TOK = get_tokenizer()
TINY = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "32",
        "--batch-size", "2", "--log-interval", "1", "--eval-iters", "2"]
VALIDATION = re.compile(r"^ validation loss at (.+) \| LM loss: (\S+) \| LM PPL: (\S+)$", re.MULTILINE)
LR = re.compile(r"^ iteration +(\d+)/ +\d+ \| .* \| learning rate (\S+) \|", re.MULTILINE)


@pytest.fixture(scope="module")
def corpus():
    return load_corpus(None, TOK, progress=False)


# -- validation and test -------------------------------------------------------------------------------

def test_eval_report_is_upstreams_block():
    lines = eval_lines("iteration 1000", 2.5, math.exp(2.5))
    line = " validation loss at iteration 1000 | LM loss: 2.500000E+00 | LM PPL: 1.218249E+01"
    assert lines == ["-" * 100, "-" * (len(line) + 1), line, "-" * (len(line) + 1)]


@pytest.mark.parametrize("text, valid, test, expected", [
    ("949,50,1", False, False, [0.949, 0.05, 0.001]),
    ("0.9/0.1", False, False, [0.9, 0.1, 0.0]),
    ("0.8", False, False, [0.8, 0.2, 0.0]),  # shares under 1 leave the rest to the next part
    ("1000,1,1", True, False, [1000 / 1001, 0.0, 1 / 1001]),  # --valid-data given: no validation share
    ("1", False, False, [1.0, 0.0, 0.0]),
])
def test_split_shares_follow_upstream(text, valid, test, expected):
    assert parse_split(text, valid_given=valid, test_given=test) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["a,b", "-1,2", "0,0,0"])
def test_bad_split_is_refused(text, capsys):
    with pytest.raises(SystemExit):
        parse_args(["--split", text])
    assert "--split" in capsys.readouterr().err


def test_split_documents_carries_fractions_in_order():
    """Upstream's rule, worked by hand: 7 documents at 0.5/0.3/0.2 are 3.5, 2.1, 1.4 -> 3, 2, 2 (the
    fractions carried on), cut in that order from the documents shuffled by RandomState(1234)."""
    order = np.arange(7)
    np.random.RandomState(1234).shuffle(order)
    parts = split_documents(7, [0.5, 0.3, 0.2])
    assert [p.tolist() for p in parts] == [order[:3].tolist(), order[3:5].tolist(), order[5:].tolist()]
    tiny = split_documents(100, [0.998, 0.001, 0.001])  # a non-zero share gets at least one document
    assert [len(p) for p in tiny] == [99, 1, 1] and split_documents(5, [1.0, 0.0, 0.0])[1] is None


def test_take_documents_keeps_their_text(corpus):
    part = take_documents(corpus, np.array([5, 2, 9]))
    assert len(part) == 3 and [part[i].tolist() for i in range(3)] == [corpus[i].tolist() for i in (5, 2, 9)]


def _data(argv, tmp_path=None):
    args = parse_args([*TINY, *argv])
    env = ParallelEnv(torch.device("cpu"))
    return args, build_data(args, TOK, env, iteration=0, notes=[])


def test_eval_batch_size_and_seq_length_shape_the_eval_batches():
    _, (train, valid, test) = _data(["--eval-batch-size", "3", "--eval-seq-length", "48", "--split", "8,1,1"])
    assert next(train)["text"].shape == (2, 32)
    assert next(valid)["text"].shape == next(test)["text"].shape == (3, 48)


def test_no_valid_or_test_share_means_no_evaluation():
    _, (_, valid, test) = _data(["--split", "1"])
    assert valid is None and test is None
    _, (_, valid, test) = _data(["--split", "9,1", "--eval-iters", "0"])
    assert valid is None and test is None


def test_valid_and_test_data_files(tmp_path):
    text = tmp_path / "valid.txt"
    text.write_text("a first document. it has two sentences.\n\nand a second one.\n")
    args, (_, valid, test) = _data(["--valid-data", str(text), "--split", "9,1,1"])
    assert args.valid_data_files == [text] and valid is not None and test is not None
    windows = {tuple(row[row != TOK.pad_id].tolist()) for row in next(valid)["target"]}
    assert all(TOK.encode("a")[0] in w or TOK.encode("and")[0] in w for w in windows)


def test_validation_resumes_where_it_stopped(tmp_path, capsys):
    """4 iterations with validation every 2 == 2, then resumed for 2: the resumed run's validation batches
    continue the stream (upstream's (iteration // eval_interval) * eval_iters)."""
    common = [*TINY, "--eval-interval", "2", "--split", "8,1,1", "--lr-decay-iters", "4"]
    main([*common, "--train-iters", "4"])
    straight = {m[0]: m[1] for m in VALIDATION.findall(capsys.readouterr().out)}
    main([*common, "--train-iters", "2", "--save", str(tmp_path)])
    capsys.readouterr()
    main([*common, "--train-iters", "4", "--load", str(tmp_path)])
    resumed = {m[0]: m[1] for m in VALIDATION.findall(capsys.readouterr().out)}
    assert resumed["iteration 4"] == straight["iteration 4"]
    assert resumed["the end of training for test data"] == straight["the end of training for test data"]


# -- data knobs ------------------------------------------------------------------------------------------

def test_non_sentence_start_moves_window_starts(corpus):
    def after_sentence_end(non_sentence_start):
        windows = Windows(corpus, 64, 0, TOK.cls_id, TOK.eos_id, sentence_end=TOK.sentence_end,
                          non_sentence_start=non_sentence_start)
        order, ends = windows._layout(0)
        good = []
        for i in range(1, 60):
            start = windows._sentence_start(order, ends, i * 64, i) if non_sentence_start < 1 else i * 64
            before, here = windows._stream(order, ends, start - 1, start + 1)
            good.append(bool(TOK.sentence_end[before]) or here == TOK.cls_id or before == TOK.eos_id)
        return np.mean(good)

    assert after_sentence_end(0.0) > 0.9 > 0.5 > after_sentence_end(1.0)


def test_sample_one_document_gives_one_document_per_window(corpus):
    windows = Windows(corpus, 64, 0, TOK.cls_id, TOK.eos_id, one_document=True)
    for i in range(100):
        w = windows[i]
        assert w[0] == TOK.cls_id and (w == TOK.cls_id).sum() == 1 and (w[:-1] == TOK.eos_id).sum() == 0
    assert windows.per_epoch >= len(corpus)


def test_loader_scatter_shares_are_disjoint_and_cover(corpus):
    parts = [scatter_documents(100, 4, k, seed=1) for k in range(4)]
    assert sorted(np.concatenate(parts).tolist()) == list(range(100)) and {len(p) for p in parts} == {25}
    splits = corpus_splits(corpus, TOK, DataOptions(split="1", loader_scatter=4), seed=1, scatter_part=2)
    assert len(splits[0]) == len(scatter_documents(len(corpus), 4, 2, seed=1))


def test_loader_scatter_needs_a_multiple_of_ranks():
    notes = []
    args = parse_args([*TINY, "--loader-scatter", "32"])
    build_data(args, TOK, ParallelEnv(torch.device("cpu")), 0, notes)
    assert notes == [" > --loader-scatter 32: 1 data-parallel rank(s) is not a multiple of it (upstream asserts); "
                     "every rank reads the whole corpus"]


def test_filter_english_keeps_english_documents(tmp_path):
    pytest.importorskip("py3langid", reason="--filter-english needs py3langid (glm-migrate[data])")
    docs = ["the miller counts the sacks of flour every evening before dinner.",
            "le meunier compte les sacs de farine chaque soir avant le dîner.",
            "der müller zählt jeden abend vor dem essen die mehlsäcke.",
            "every morning the baker lights the oven before the sun is up."]
    path = tmp_path / "mixed.txt"
    path.write_text("\n\n".join(docs))
    corpus = load_corpus([path], TOK, progress=False, cache=False)
    assert english_documents(corpus, TOK, progress=False).tolist() == [0, 3]


def test_masker_knobs_reach_the_masker():
    args = parse_args(["--block-mask-prob", "0.1", "--context-mask-ratio", "0.05", "--short-seq-prob", "0.02",
                       "--single-span-prob", "0.05", "--no-shuffle-block", "--no-block-position", "--sentinel-token",
                       "--gap-sentence-ratio", "0.2", "--gpt-infill-prob", "0.3"])
    kwargs = masker_kwargs(args, TOK)
    assert kwargs | dict(block_mask_prob=0.1, context_mask_ratio=0.05, short_seq_prob=0.02, single_span_prob=0.05,
                         shuffle_blocks=False, block_position_encoding=False, sentinel_base=TOK.num_tokens,
                         gap_sentence_ratio=0.2, gpt_infill_prob=0.3) == kwargs
    assert args.max_position_embeddings == 129  # sentinel blocks sit at --seq-length


def test_sentinel_token_needs_a_position_past_seq_length(capsys):
    with pytest.raises(SystemExit):
        parse_args(["--sentinel-token", "--seq-length", "64", "--max-position-embeddings", "64"])
    assert "--sentinel-token puts Part B at position --seq-length" in capsys.readouterr().err


def test_accepted_loader_flags_change_nothing():
    plain = parse_args([*TINY])
    flagged = parse_args([*TINY, "--shuffle", "--lazy-loader", "--no-lazy-loader", "--loose-json",
                          "--fix-command-token", "--no-pre-tokenize", "--fp32-embedding", "--fp32-layernorm",
                          "--fp32-tokentypes", "--fp32-allreduce"])
    assert masker_kwargs(plain, TOK) == masker_kwargs(flagged, TOK)
    batches = [next(build_data(a, TOK, ParallelEnv(torch.device("cpu")), 0, [])[0]) for a in (plain, flagged)]
    for key in batches[0]:
        assert torch.equal(batches[0][key], batches[1][key])


# -- named corpora, vocabularies, names ---------------------------------------------------------------------

def test_named_corpora_resolve_through_the_mapping(tmp_path, monkeypatch):
    (tmp_path / "books").mkdir()
    for name in ("b.jsonl", "a.txt", "skip.md"):
        (tmp_path / "books" / name).write_text("x")
    (tmp_path / "wiki.json").write_text("x")
    mapping = tmp_path / "corpora.toml"
    mapping.write_text('wikibook = "books"\nbert-large = ["wiki.json", "books/a.txt"]\n')
    monkeypatch.setenv("GLM_CORPORA", str(mapping))
    assert resolve_corpus("wikibook") == [tmp_path / "books" / "a.txt", tmp_path / "books" / "b.jsonl"]
    assert resolve_corpus("bert-large") == [tmp_path / "wiki.json", tmp_path / "books" / "a.txt"]
    with pytest.raises(ValueError, match=r"names no such corpus \(it names: bert-large, wikibook\)"):
        resolve_corpus("cnn_dm")
    mapping.write_text('cnn_dm = "/no/such/cnn_dm"\n')
    with pytest.raises(ValueError, match=f"cnn_dm: {re.escape(str(mapping))} maps it to /no/such/cnn_dm, which"):
        resolve_corpus("cnn_dm")


def test_named_corpus_without_a_mapping_is_one_line_naming_the_path(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("GLM_CORPORA", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    with pytest.raises(SystemExit) as exit_info:
        parse_args(["--train-data", "bert-large"])
    assert exit_info.value.code == 2
    [line] = capsys.readouterr().err.strip().splitlines()[-1:]
    assert f"no corpus mapping at {tmp_path}/glm-migrate/corpora.toml" in line and "bert-large" in line


def test_tokenizer_model_type_picks_the_vocabulary(tmp_path, monkeypatch):
    for name in ("bert-base-uncased-vocab.txt", "bert-base-cased-vocab.txt", "gpt2-vocab.json",
                 "roberta-vocab.json"):
        (tmp_path / name).write_text("x")
    monkeypatch.setenv("GLM_VOCAB_DIR", str(tmp_path))
    args = parse_args(["--tokenizer-type", "BertWordPieceTokenizer", "--tokenizer-model-type", "bert-large-uncased"])
    assert (args.tokenizer_path, args.tokenizer_lowercase) == (str(tmp_path / "bert-base-uncased-vocab.txt"), True)
    args = parse_args(["--tokenizer-type", "BertWordPieceTokenizer", "--tokenizer-model-type", "bert-base-cased"])
    assert (args.tokenizer_path, args.tokenizer_lowercase) == (str(tmp_path / "bert-base-cased-vocab.txt"), False)
    args = parse_args(["--tokenizer-type", "GPT2BPETokenizer", "--tokenizer-model-type", "roberta"])
    assert args.tokenizer_path == str(tmp_path / "roberta-vocab.json")


def test_experiment_name_and_save_directory():
    now = datetime(2026, 7, 8, 15, 28)
    args = parse_args(["--save", "ckpt", "--experiment-name", "blocklm-10b"])
    assert experiment_save_dir(args, now) == ("blocklm-10b07-08-15-28", "ckpt/blocklm-10b07-08-15-28")
    args = parse_args(["--save", "ckpt"])  # no name: --save itself, as before
    assert experiment_save_dir(args, now) == ("glm07-08-15-28", "ckpt")


def test_load_continues_in_its_directory_unless_new_save_directory(tmp_path, capsys):
    main([*TINY, "--train-iters", "1", "--save", str(tmp_path / "ckpt" / "blocklm-x01-01-00-00")])
    capsys.readouterr()
    load = str(tmp_path / "ckpt" / "blocklm-x01-01-00-00")
    for extra, expected in (([], "blocklm-x01-01-00-00"), (["--new-save-directory"], r"blocklm-x\d\d-\d\d-\d\d-\d\d")):
        args = parse_args(["--save", str(tmp_path / "ckpt"), "--load", load, "--experiment-name", "blocklm-x", *extra])
        name, save = experiment_save_dir(args)
        assert re.fullmatch(expected, name) and save == str(tmp_path / "ckpt" / name)


def test_no_load_lr_scheduler_restarts_the_schedule(tmp_path, capsys):
    schedule = ["--warmup", "0.5", "--lr-decay-iters", "4", "--lr", "1e-3"]
    main([*TINY, *schedule, "--train-iters", "2", "--save", str(tmp_path)])
    capsys.readouterr()
    main([*TINY, *schedule, "--train-iters", "3", "--load", str(tmp_path)])
    continued = dict(LR.findall(capsys.readouterr().out))
    main([*TINY, *schedule, "--train-iters", "3", "--load", str(tmp_path), "--no-load-lr-scheduler"])
    restarted = dict(LR.findall(capsys.readouterr().out))
    # warmup over 2 steps, then linear decay to 0.1 over 2: step 3 is 0.55e-3; a fresh schedule's step 1, 0.5e-3
    assert float(continued["3"]) == pytest.approx(5.5e-4) and float(restarted["3"]) == pytest.approx(5e-4)


# -- TensorBoard ---------------------------------------------------------------------------------------------

def test_summary_dir_writes_tensorboard_scalars(tmp_path, capsys):
    pytest.importorskip("tensorboard", reason="--summary-dir needs tensorboard (glm-migrate[tensorboard])")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    main([*TINY, "--train-iters", "2", "--eval-interval", "1", "--fp16", "--loss-scale", "128",
          "--summary-dir", str(tmp_path),
          "--experiment-name", "tb"])
    [run] = (tmp_path / "runs").iterdir()
    assert re.fullmatch(r"tb\d\d-\d\d-\d\d-\d\d", run.name)
    events = EventAccumulator(str(run))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"Train/lr", "Train/train_loss", "Train/grad_norm", "Train/loss_scale", "Train/tokens_per_second",
            "Train/valid_loss", "Train/valid_ppl"} <= tags
    assert [e.step for e in events.Scalars("Train/valid_loss")] == [1, 2]
    assert all(e.value > 0 and math.isfinite(e.value) for e in events.Scalars("Train/grad_norm"))


# -- fp16 ------------------------------------------------------------------------------------------------------

def _overflowing_steps(precision, pattern):
    """Run ``pattern`` steps (True: inf gradient) through the scaler; the scale after each."""
    p = torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([p], lr=0.1)
    precision.scaler.scale(torch.ones(1))  # GradScaler sets its scale up on first use
    scales = []
    for overflow in pattern:
        p.grad = torch.full((1,), math.inf if overflow else 1.0)
        precision.scaler.step(optimizer)
        skipped = precision.update()
        assert skipped == overflow
        scales.append(precision.loss_scale)
    return scales


def test_hysteresis_tolerates_overflows_before_halving():
    precision = Precision(torch.device("cpu"), torch.float16, window=3, hysteresis=2, init_scale=1024.0)
    scales = _overflowing_steps(precision, [True, True, True, False, False, False, True, True])
    # 1st overflow tolerated, 2nd halves, 3rd halves (hysteresis spent); 3 clean steps double it and restore
    # the hysteresis: the next overflow is tolerated again, the one after halves.
    assert scales == [1024, 512, 256, 256, 256, 512, 512, 256]


def test_min_scale_is_a_floor():
    precision = Precision(torch.device("cpu"), torch.float16, window=1000, min_scale=2.0, init_scale=8.0)
    assert _overflowing_steps(precision, [True] * 4) == [4.0, 2.0, 2.0, 2.0]


def test_fp16_flags_and_deepspeed_fields(tmp_path):
    args = parse_args(["--fp16", "--loss-scale-window", "500", "--hysteresis", "3", "--min-scale", "4"])
    assert (args.loss_scale_window, args.hysteresis, args.min_scale) == (500, 3, 4)
    config = tmp_path / "ds.json"
    config.write_text('{"fp16": {"enabled": true, "loss_scale": 0, "loss_scale_window": 200, "hysteresis": 5, '
                      '"min_loss_scale": 8, "initial_scale_power": 16}, "zero_optimization": {"stage": 2}}')
    args = parse_args(["--deepspeed", "--deepspeed_config", str(config)])
    assert (args.fp16, args.loss_scale_window, args.hysteresis, args.min_scale) == (True, 200, 5, 8)
    assert args.initial_loss_scale == 2.0**16 and args.zero_stage == 2


def test_fp16_on_cpu_trains(capsys):
    main([*TINY, "--train-iters", "2", "--fp16", "--hysteresis", "1"])
    out = capsys.readouterr().out
    assert re.search(r"iteration +2/ +2 \| .* \| lm loss \S+ \| loss scale \d+\.\d \|", out)


# -- model variants --------------------------------------------------------------------------------------------

def test_intermediate_size_and_vocab_padding_shape_the_model(tmp_path, capsys):
    main([*TINY, "--train-iters", "1", "--intermediate-size", "48", "--make-vocab-size-divisible-by", "64",
          "--save", str(tmp_path)])
    capsys.readouterr()
    weights = torch.load(tmp_path / "1" / "mp_rank_00_model_states.pt", weights_only=True)["module"]
    assert weights["transformer.layers.0.mlp.dense_h_to_4h.weight"].shape == (48, 32)
    assert weights["transformer.layers.0.mlp.dense_4h_to_h.weight"].shape == (32, 48)
    assert weights["word_embeddings.weight"].shape[0] == -(-TOK.num_tokens // 64) * 64


@pytest.mark.parametrize("argv, reason", [
    (["--transformer-xl"], "upstream's GPT-XL objective"),
    (["--mem-length", "256"], "upstream's GPT-XL objective"),
    (["--encoder-decoder"], "upstream's EncoderDecoder, two transformer stacks"),
])
def test_refused_model_variants_say_why(argv, reason, capsys):
    with pytest.raises(SystemExit):
        parse_args(argv)
    assert reason in capsys.readouterr().err.strip().splitlines()[-1]


def test_intermediate_size_survives_the_hugging_face_config(tmp_path):
    from glm_port.models.glm import GLMConfig

    config = GLMConfig(vocab_size=128, hidden_size=32, num_attention_heads=2, intermediate_size=48)
    config.save_pretrained(tmp_path)
    assert GLMConfig.from_pretrained(tmp_path).intermediate_size == 48


def test_every_data_knob_trains_and_validates(capsys):
    main([*TINY, "--train-iters", "2", "--eval-interval", "1", "--split", "8,1,1", "--task-mask",
          "--bert-prob", "0.4", "--gap-sentence-prob", "0.3", "--gpt-min-ratio", "0.25", "--block-mask-prob", "0.1",
          "--context-mask-ratio", "0.05", "--short-seq-prob", "0.3", "--single-span-prob", "0.1", "--sentinel-token",
          "--no-block-position", "--no-shuffle-block", "--non-sentence-start", "0.5", "--sample-one-document",
          "--max-position-embeddings", "40", "--seq-length", "39"])
    found = {m[0]: float(m[1]) for m in VALIDATION.findall(capsys.readouterr().out)}
    assert list(found) == ["iteration 1", "iteration 2", "the end of training for val data",
                           "the end of training for test data"]
    assert all(math.isfinite(v) and v > 0 for v in found.values())
