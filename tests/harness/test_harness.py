"""The upstream harness's own pieces, without a checkout: log lines, corpus, vocabulary, bad input."""

import json
from pathlib import Path

import pytest

import harness
from harness import selfcheck, verify

UPSTREAM_CORPORA = '''
class PromptReader: pass

class TestDataset(PromptReader):
    PATH = '{path}'
    assert_str = "make sure to set PATH for wikipedia data_utils/corpora.py"
'''


def _checkout(root, corpus="/nowhere/data/test.json"):
    (root / "data_utils").mkdir(parents=True)
    (root / "data_utils" / "corpora.py").write_text(UPSTREAM_CORPORA.format(path=corpus))
    (root / "pretrain_glm.py").write_text("")
    return root


def test_loss_lines_are_read_in_upstream_log_format():
    line = (
        " iteration        3/      20 | elapsed time per iteration (ms): 2416.9 |"
        " learning rate 9.756E-04 | lm loss 1.019575E+01 |"
    )
    assert [float(x) for x in harness.LOSS.findall(line)] == [10.19575]
    assert [float(x) for x in harness.ELAPSED.findall(line)] == [2416.9]


def test_corpus_is_json_lines_of_vocabulary_words_and_never_overwritten(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "the", "river", "##ing", "stone", "a", "9", "light"]))
    corpus = tmp_path / "data" / "test.json"
    assert harness.ensure_corpus(vocab, corpus, documents=3) == corpus
    rows = [json.loads(line) for line in corpus.read_text().splitlines()]
    assert len(rows) == 3 and all(row["prompt"] == "" for row in rows)
    assert set(rows[0]["text"].lower().replace(".", "").split()) <= {"the", "river", "stone", "light"}
    again = tmp_path / "again.json"
    harness.ensure_corpus(vocab, again, documents=3)
    assert again.read_bytes() == corpus.read_bytes()  # seeded: the same bytes every time
    corpus.write_text("mine\n")
    harness.ensure_corpus(vocab, corpus)
    assert corpus.read_text() == "mine\n"
    assert [p.name for p in corpus.parent.iterdir()] == ["test.json"]  # no temporary file left


def test_the_corpus_path_is_read_from_the_checkout(tmp_path):
    assert harness.corpus_path(_checkout(tmp_path / "a")) == Path("/nowhere/data/test.json")
    relative = _checkout(tmp_path / "b", corpus="data/test.json")
    assert harness.corpus_path(relative) == relative / "data" / "test.json"
    (tmp_path / "c" / "data_utils").mkdir(parents=True)
    (tmp_path / "c" / "data_utils" / "corpora.py").write_text("class Other:\n    PATH = 'x'\n")
    with pytest.raises(harness.HarnessError, match="no class TestDataset with a string PATH"):
        harness.corpus_path(tmp_path / "c")
    with pytest.raises(harness.HarnessError, match="cannot read"):
        harness.corpus_path(tmp_path / "missing")


def test_the_vocabulary_comes_from_the_flag_the_environment_or_the_checkout(tmp_path, monkeypatch):
    monkeypatch.delenv(harness.VOCAB_ENV, raising=False)
    folder = tmp_path / "vocab"
    folder.mkdir()
    (folder / harness.VOCAB_NAME).write_text("the\n")
    assert harness.find_vocab(folder) == folder / harness.VOCAB_NAME
    assert harness.find_vocab(folder / harness.VOCAB_NAME) == folder / harness.VOCAB_NAME
    with pytest.raises(harness.HarnessError, match="give --vocab PATH or set GLM_VOCAB"):
        harness.find_vocab()
    with pytest.raises(harness.HarnessError, match="--vocab .*missing.txt: no such file"):
        harness.find_vocab(tmp_path / "missing.txt")
    checkout = _checkout(tmp_path / "GLM")
    (checkout / ".pytorch_pretrained_bert").mkdir()
    (checkout / ".pytorch_pretrained_bert" / harness.VOCAB_NAME).write_text("the\n")
    assert harness.find_vocab(checkout=checkout) == checkout / ".pytorch_pretrained_bert" / harness.VOCAB_NAME
    monkeypatch.setenv(harness.VOCAB_ENV, str(folder))
    assert harness.find_vocab(checkout=checkout) == folder / harness.VOCAB_NAME


def test_a_checkout_without_a_vocabulary_gets_one_linked_in(tmp_path, monkeypatch):
    monkeypatch.delenv(harness.VOCAB_ENV, raising=False)
    checkout = _checkout(tmp_path / "GLM")
    with pytest.raises(harness.HarnessError, match="no BERT vocabulary"):
        harness.prepare_tree(checkout, tmp_path / "work")
    assert not (tmp_path / "work").exists()  # refused before copying anything
    vocab = tmp_path / harness.VOCAB_NAME
    vocab.write_text("the\n")
    tree = harness.prepare_tree(checkout, tmp_path / "work", vocab)
    assert (tree / ".pytorch_pretrained_bert" / harness.VOCAB_NAME).read_text() == "the\n"
    assert (tree / "data_utils" / "corpora.py").is_file() and not (checkout / ".pytorch_pretrained_bert").exists()


@pytest.mark.parametrize("main", [selfcheck.main, verify.main], ids=["selfcheck", "verify"])
def test_refuses_a_directory_that_is_not_a_glm_checkout(main, tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(tmp_path)])
    assert exc.value.code == 2
    assert "is not a THUDM/GLM checkout (no pretrain_glm.py)" in capsys.readouterr().err


@pytest.mark.parametrize("main", [selfcheck.main, verify.main], ids=["selfcheck", "verify"])
def test_a_missing_vocabulary_is_a_one_line_error(main, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv(harness.VOCAB_ENV, raising=False)
    with pytest.raises(SystemExit) as exc:
        main([str(_checkout(tmp_path / "GLM")), "--workdir", str(tmp_path / "work")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "no BERT vocabulary: give --vocab PATH or set GLM_VOCAB" in err and "Traceback" not in err


# -- the other entry points (harness.entrypoints), without a checkout ---------------------------

from harness import entrypoints  # noqa: E402


def test_entry_point_data_is_written_in_upstreams_formats_the_same_every_time(tmp_path):
    root = entrypoints.write_data(tmp_path / "a")
    again = entrypoints.write_data(tmp_path / "b")
    files = sorted(p.relative_to(root) for p in root.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    assert all((root / f).read_bytes() == (again / f).read_bytes() for f in files)
    rte = [json.loads(x) for x in (root / "RTE" / "val.jsonl").read_text().splitlines()]
    assert {"premise", "hypothesis", "label", "idx"} <= set(rte[0]) and rte[0]["label"] in ("entailment", "not_entailment")
    copa = json.loads((root / "COPA" / "train.jsonl").read_text().splitlines()[0])
    assert {"premise", "choice1", "choice2", "question", "label", "idx"} <= set(copa)
    assert "label" not in json.loads((root / "RTE" / "test.jsonl").read_text().splitlines()[0])
    for split in ("train", "val", "test"):  # upstream's seq2seq reads its dev split from val.*
        sources = (root / "s2s" / f"{split}.source").read_text().splitlines()
        assert len(sources) == len((root / "s2s" / f"{split}.target").read_text().splitlines()) > 0
    assert all("text" in json.loads(x) for x in (root / "lm" / "lambada_test.jsonl").read_text().splitlines())
    assert " = Title = " in (root / "lm" / "wiki.test.tokens").read_text()


def test_more_superglue_and_clue_data_hold_what_upstreams_readers_check(tmp_path):
    root = entrypoints.write_data(tmp_path)
    rows = lambda task, name: [json.loads(x) for x in (root / task / name).read_text(encoding="utf-8").splitlines()]  # noqa: E731
    multirc = rows("MultiRC", "val.jsonl")[0]  # passage -> questions -> answers, labels 0/1 on the answers
    answer = multirc["passage"]["questions"][0]["answers"][0]
    assert {"text", "idx", "label"} <= set(answer) and answer["label"] in (0, 1)
    assert "label" not in rows("MultiRC", "test.jsonl")[0]["passage"]["questions"][0]["answers"][0]
    for wsc in rows("WSC", "train.jsonl"):  # WscProcessor asserts the pronoun is at span2_index
        words, target = wsc["text"].split(), wsc["target"]
        assert words[target["span2_index"]] == target["span2_text"]
        assert " ".join(words[target["span1_index"]:][:2]) == target["span1_text"] and wsc["candidates"]
    for record in rows("ReCoRD", "val.jsonl"):  # entity ends are inclusive; answers are entities
        text = record["passage"]["text"]
        entities = {text[e["start"]:e["end"] + 1] for e in record["passage"]["entities"]}
        assert "@placeholder" in record["qas"][0]["query"]
        assert {a["text"] for a in record["qas"][0]["answers"]} <= entities
    assert rows("RTE", "dev32.jsonl")[0]["label"] in ("entailment", "not_entailment")  # --few-superglue's dev split
    for task in ("afqmc", "tnews", "cluewsc"):  # CLUE: {train,dev,test}.json
        assert "label" in rows(task, "dev.json")[0] and "label" not in rows(task, "test.json")[0]
    for wsc in rows("cluewsc", "train.json"):  # character indices
        target = wsc["target"]
        assert wsc["text"][target["span2_index"]] == target["span2_text"]
        assert wsc["text"][target["span1_index"]:].startswith(target["span1_text"])
    flags = entrypoints.chinese_flags(entrypoints.MODEL_FLAGS)
    assert "BertWordPieceTokenizer" not in flags and flags[-3:-1] == ["--tokenizer-type", "ChineseSPTokenizer"]
    assert "--tokenizer-model-type" not in flags and "--task-mask" in flags and "--fix-command-token" in flags


def test_seq2seq_zero_shot_and_multichoice_data_hold_what_upstreams_readers_read(tmp_path):
    """The data of seq_xsum.sh, seq_gigaword.sh, seq_squad_generation.sh, seq_blank.sh, seq_customization.sh,
    zero_lm.sh and evaluate_multichoice.sh, in the layout upstream's readers open (tasks/seq2seq/dataset.py,
    tasks/language_model/dataset.py, tasks/superglue/dataset.py's MultiChoiceDataset)."""
    root = entrypoints.write_data(tmp_path)
    splits = json.loads((root / "xsum" / "XSum-TRAINING-DEV-TEST-SPLIT-90-5-5.json").read_text())
    assert set(splits) == {"train", "validation", "test"}
    for doc in (d for ids in splits.values() for d in ids):  # XSumProcessor: [SN]KEY[SN] sections, one per line
        text = (root / "xsum" / f"{doc}.summary").read_text()
        assert "[SN]FIRST-SENTENCE[SN]\n" in text and "[SN]RESTBODY[SN]\n" in text
    for task in ("gigaword", "customization"):
        for split in ("train", "val", "test"):
            sources = (root / task / f"{split}.source").read_text().splitlines()
            assert len(sources) == len((root / task / f"{split}.target").read_text().splitlines()) > 0
    assert (root / "gigaword" / "train.source").read_text().startswith("-lrb- ")
    for split in ("train", "dev", "test"):  # SQuADGenerationProcessor: data -> paragraphs -> qas -> answers
        paragraph = json.loads((root / "squad_generation" / f"{split}.json").read_text())["data"][0]["paragraphs"][0]
        qa = paragraph["qas"][0]
        assert qa["question"].endswith("?") and qa["answers"][0]["text"] in paragraph["context"]
    for version, name in (("v2.0", "squad"), ("v1.1", "squad_v1")):  # SQuAD's JSON; 1.1 without unanswerable questions
        for split in ("train", "dev"):
            for paragraph in json.loads((root / name / f"{split}-{version}.json").read_text())["data"][0]["paragraphs"]:
                for qa in paragraph["qas"]:
                    assert qa["id"] and all(paragraph["context"][a["answer_start"]:].startswith(a["text"])
                                            for a in qa["answers"])  # fmt: skip
                    assert qa["answers"] or name == "squad"
    blanked = (root / "blank" / "blank" / "test.maskratio0.1.blank").read_text().splitlines()
    assert len(blanked) == len((root / "blank" / "test.txt").read_text().splitlines())
    assert all(line.count("<blank>") == 1 for line in blanked) and (root / "blank" / "valid.txt").is_file()
    documents = (root / "lm" / "lm-test.txt").read_text().splitlines()  # longer than --seq-length 128: windows
    assert documents and all(len(d.split()) > 128 for d in documents)
    for row in map(json.loads, (root / "mc" / "test.jsonl").read_text().splitlines()):
        assert row["inputs_pretokenized"] and len(row["choices_pretokenized"]) == 3
        assert row["label"] in range(3)
    flags = {name: entrypoints._finetune_flags(name, root, tmp_path / "P", tmp_path / "S")
             for name in entrypoints.ENTRY_POINTS if name in entrypoints.SEQ2SEQ_TASKS or "lm" in name
             or name in ("lambada_uni", "multichoice")}  # fmt: skip
    assert flags["xsum"][flags["xsum"].index("--task") + 1] == "xsum"
    assert "--unidirectional" in flags["zero_lm_uni"] and "--unidirectional" not in flags["zero_lm"]
    assert flags["multichoice"][flags["multichoice"].index("--epochs") + 1] == "0"
    assert all(entrypoints.MODES[name] == ("1", "tp2") for name in flags)  # upstream's scripts take MP_SIZE
    # model parallel: every seq2seq task stops in upstream's own beam search, on both sides (not a mismatch)
    for name in entrypoints.SEQ2SEQ_TASKS:  # a minimum length: MinLengthLogitsProcessor's IndexError; squad: its KeyError
        flags = entrypoints._finetune_flags(name, root, tmp_path / "P", tmp_path / "S")
        if name != "squad" and flags[flags.index("--min-tgt-length") + 1] != "0":
            assert entrypoints.UPSTREAM_DEFECTS[(name, "tp2")] == entrypoints.SEQ2SEQ_TP2
    assert ("blank", "tp2") in entrypoints.UPSTREAM_UNDEFINED and ("squad", "tp2") in entrypoints.UPSTREAM_DEFECTS
    assert entrypoints.MODES["change_mp"] == entrypoints.MODES["convert"] == ("1",)


def test_squad_v1s_hub_tokenizer_loads_offline_from_the_trees_vocabulary(tmp_path):
    """seq_squad_v1.sh's reader calls ``transformers.AutoTokenizer.from_pretrained("bert-base-uncased")``: under
    :func:`entrypoints.offline_bert_tokenizer`'s environment it loads, without a network, the tree's own vocabulary."""
    import os
    import subprocess
    import sys

    tree = tmp_path / "GLM"
    (tree / entrypoints.up.VOCAB_CACHE).parent.mkdir(parents=True)
    (tree / entrypoints.up.VOCAB_CACHE).write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nthe\ncat\n##s\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "TRANSFORMERS_"))}
    env.update(entrypoints.offline_bert_tokenizer(tree, tmp_path / "out"))
    code = ("import transformers; t = transformers.AutoTokenizer.from_pretrained('bert-base-uncased'); "
            "e = t('The cats', return_offsets_mapping=True, add_special_tokens=False); "
            "print(e['input_ids'], [list(o) for o in e['offset_mapping']])")  # fmt: skip
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[0] == "[5, 6, 7] [[0, 3], [4, 7], [7, 8]]"


def test_overall_figure_stops_where_another_ranks_output_runs_into_its_line():
    line = (" >> |epoch: 0| overall: total = 8 f1a = 0.5455 em = 0.2500 acc = 37.5000/tmp/GLM/model/downstream.py:122: "
            "FutureWarning: Positional args are being deprecated")
    figures = entrypoints.Figures()
    entrypoints.read_figures(line, figures)
    assert figures.items == [("overall", "0 total = 8 f1a = 0.5455 em = 0.2500 acc = 37.5000")]


def test_entry_point_figures_are_read_from_upstreams_lines():
    text = "\n".join([
        " iteration        2/       8 | elapsed time per iteration (ms): 313.5 | learning rate 8.500E-05 | lm loss 5.872517E-01 |",
        " >> |epoch: 0| overall: total = 8 accuracy = 62.5000",
        "number correct: 3.0 | total examples: 8 | avg accuracy: 0.38",
        "avg loss: 1.0333E+01 | ppl: 3.0728E+04 | adjusted ppl: 7.1182E+04 | token ratio: 1.08 |",
        "GLM: <|startofpiece|> coin coin",
    ])  # fmt: skip
    figures = entrypoints.Figures()
    entrypoints.read_figures(text, figures)
    assert [w for w, _ in figures.items] == ["lm loss", "overall", "lambada", "wikitext", "generated"]
    assert figures.items[1] == ("overall", "0 total = 8 accuracy = 62.5000")


@pytest.mark.parametrize("a, b, equal", [
    ("lm loss 9.997754", "lm loss 9.997755", True),  # the 7th digit: within 1e-6
    ("accuracy = 62.5000", "accuracy = 37.5000", False),
    ("<|startofpiece|> coin coin", "<|startofpiece|> coin", False),
    ("american american", "american britain", False),
])  # fmt: skip
def test_figures_agree_word_by_word_numbers_within_the_tolerance(a, b, equal):
    assert entrypoints.same(a, b, 1e-6) is equal


def test_an_entry_point_comparison_names_what_differs_and_a_failed_run():
    def side(*items, code=0):
        return entrypoints.SideRun(code, entrypoints.Figures(list(items)), Path("x.log"), "" if code == 0 else "Boom: no")

    ok = entrypoints.EntryComparison("superglue", side(("lm loss", "0.5")), side(("lm loss", "0.5")), 1e-6)
    assert ok.ok and "MATCH" in entrypoints.table(ok)
    off = entrypoints.EntryComparison("generate", side(("generated", "a b")), side(("generated", "a c")), 1e-6)
    assert not off.ok and off.problems == ["generated: 'a b' (original) vs 'a c' (ported)"]
    failed = entrypoints.EntryComparison("lambada", side(), side(code=1), 1e-6)
    assert failed.problems == ["ported run failed: Boom: no (log: x.log)"]


def test_shard_digest_reads_every_tensor_of_a_checkpoint_holding_a_namespace(tmp_path):
    import argparse

    import torch

    (tmp_path / "5").mkdir()
    torch.save({"module": {"w": torch.ones(2, 3)}, "args": argparse.Namespace(a=1), "iteration": 5},
               tmp_path / "5" / "mp_rank_00_model_states.pt")  # fmt: skip
    digest = dict(entrypoints.shard_digest(tmp_path))
    assert digest["5/mp_rank_00_model_states.pt args"] == "Namespace"
    assert digest["5/mp_rank_00_model_states.pt module.w"].startswith("(2, 3) ")


def test_verify_entry_points_flag_defaults_to_pretraining_and_refuses_unknown_names(capsys):
    assert verify.parser().parse_args(["GLM"]).entry_points == ["pretrain"]
    assert verify.parser().parse_args(["GLM", "--entry-points", "superglue", "generate"]).entry_points == ["superglue", "generate"]
    with pytest.raises(SystemExit) as exit_:
        verify.parser().parse_args(["GLM", "--entry-points", "nope"])
    assert exit_.value.code == 2 and "invalid choice: 'nope'" in capsys.readouterr().err


def test_upstreams_own_failure_alike_on_both_sides_is_told_apart():
    known = entrypoints.UPSTREAM_DEFECTS[("seq2seq", "tp2")]

    def failed(cause):
        return entrypoints.SideRun(1, entrypoints.Figures(), Path("x.log"), cause)

    alike = entrypoints.EntryComparison("seq2seq", failed(known), failed(known), 1e-6, "tp2")
    assert alike.ok and alike.defect == known and "UPSTREAM" in entrypoints.table(alike)
    ours_only = entrypoints.EntryComparison("seq2seq", entrypoints.SideRun(0, entrypoints.Figures([("x", "1")]), Path("x.log")),
                                            failed(known), 1e-6, "tp2")  # fmt: skip
    assert not ours_only.ok and not ours_only.defect
    other_mode = entrypoints.EntryComparison("seq2seq", failed(known), failed(known), 1e-6, "1")
    assert not other_mode.ok


def test_entry_points_without_a_pretrained_checkpoint_fail_in_one_line_each(tmp_path, capsys):
    import argparse

    ported = tmp_path / "GLM-ported"
    ported.mkdir()  # no pretrain_glm.py: the checkpoint cannot be made
    args = argparse.Namespace(timeout=120, entry_modes=["1"], entry_rtol=1e-6)
    results = verify.run_entry_points(["superglue", "generate"], tmp_path / "GLM", ported, tmp_path, args)
    assert [r.name for r in results] == ["superglue", "generate"] and not any(r.ok for r in results)
    assert all("pretraining the checkpoint failed" in r.problems[0] for r in results)
    assert "entry points not run: pretraining the checkpoint failed" in capsys.readouterr().out


def test_deepspeed_runs_write_upstreams_config_layout_and_let_the_migrated_tree_import_deepspeed_fp16_runs_check_their_scale(tmp_path):
    """``--deepspeed`` runs (tests/e2e/test_upstream_deepspeed.py): the config has upstream's keys, with the entry
    point's own batch size, learning rate and weight decay (upstream's arguments.py takes them from it); the migrated
    side keeps apex unimportable but not DeepSpeed, whose engine the run asks for."""
    config = json.loads(entrypoints.write_deepspeed_config(tmp_path / "ds.json", "superglue").read_text())
    flags = entrypoints._finetune_flags("superglue", tmp_path, tmp_path / "P", tmp_path / "S")
    assert config["train_micro_batch_size_per_gpu"] == int(flags[flags.index("--batch-size") + 1])
    assert config["optimizer"]["params"]["lr"] == float(flags[flags.index("--lr") + 1])
    assert config["optimizer"]["params"]["weight_decay"] == float(flags[flags.index("--weight-decay") + 1])
    assert "fp16" not in config and "zero_optimization" not in config and config["optimizer"]["params"]["torch_adam"]
    plain, engine = entrypoints._launch("ported", "x.py"), entrypoints._launch("ported", "x.py", deepspeed=True)
    assert "deepspeed" in plain[plain.index("harness.without") + 1].split(",")
    assert engine[engine.index("harness.without") + 1].split(",") == ["apex", "amp_C"]
    assert entrypoints._launch("original", "x.py", deepspeed=True)[1:] == ["x.py"]
    with pytest.raises(ValueError, match="--deepspeed"):
        entrypoints.run_entry("generate", "ported", tmp_path, {}, tmp_path, tmp_path, tmp_path, 1, deepspeed=tmp_path)
    for fp16 in ("yes", "1e3"):  # --fp16 runs: "dynamic" (upstream's dynamic loss scaler) or a static --loss-scale N
        with pytest.raises(ValueError, match="--fp16"):
            entrypoints.run_entry("superglue", "ported", tmp_path, {}, tmp_path, tmp_path, tmp_path, 1, fp16=fp16)


def test_figures_upstream_leaves_undefined_are_not_compared_the_rest_is(tmp_path):
    """seq_blank.sh at model-parallel size 2: the filled line is whichever rank's TCPStore.set came last (upstream's
    race, UPSTREAM_UNDEFINED); its losses are still compared, and the same lines in one process are."""
    def run(*items):
        return entrypoints.SideRun(0, entrypoints.Figures(list(items)), tmp_path / "log", "")

    original = run(("lm loss", "9.643629E+00"), ("summary", "river mat american american"))
    ported = run(("lm loss", "9.643629E+00"), ("summary", "river matinasinasinas"))
    raced = entrypoints.EntryComparison("blank", original, ported, rtol=1e-6, mode="tp2")
    assert raced.ok and "TCPStore" in raced.undefined and "UPSTREAM: summary not compared" in entrypoints.table(raced)
    assert not entrypoints.EntryComparison("blank", original, ported, rtol=1e-6, mode="1").ok
    ported = run(("lm loss", "9.643700E+00"), ("summary", "river matinasinasinas"))
    assert not entrypoints.EntryComparison("blank", original, ported, rtol=1e-6, mode="tp2").ok


def test_run_entry_passes_the_modes_and_engines_flags_to_upstreams_script(tmp_path):
    """What ``run_entry`` starts: ``tp2`` under torchrun with --model-parallel-size 2; ``deepspeed`` with --deepspeed
    --deepspeed_config; ``fp16`` with --fp16 (and --loss-scale N). A stand-in finetune_glm.py prints its arguments."""
    import os

    tree = tmp_path / "GLM"
    tree.mkdir()
    (tree / "finetune_glm.py").write_text("import sys\nprint('ARGS', ' '.join(sys.argv[1:]), flush=True)\n")
    config = entrypoints.write_deepspeed_config(tmp_path / "ds.json", "superglue")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = entrypoints.run_entry("superglue", "original", tree, env, tmp_path, tmp_path / "P", tmp_path, 120, "tp2",
                                deepspeed=config, fp16="1024")  # fmt: skip
    assert run.code == 0, run.log.read_text()
    args = [line.split() for line in run.log.read_text().splitlines() if line.startswith("ARGS")]
    assert len(args) == 2  # two processes
    for argv in args:
        assert argv[argv.index("--model-parallel-size") + 1] == "2"
        assert argv[argv.index("--deepspeed_config") + 1] == str(config) and "--deepspeed" in argv
        assert "--fp16" in argv and argv[argv.index("--loss-scale") + 1] == "1024"
