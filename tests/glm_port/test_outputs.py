"""What a command writes never deletes what it reads, and an output that cannot be written is refused before any
work (glm_port/outputs.py, shared by glm-merge, glm-export, glm-convert, glm-finetune and glm-pretrain).
The data-loss cases run on throwaway trees with a sibling that must survive. (glm-merge and glm-export's own
cases: tests/glm_port/test_convert.py; glm-convert's: tests/glm_port/chatglm2/test_convert.py.)"""

import os
import stat
from pathlib import Path

import pytest
import torch

from glm_port.finetune.run import main as finetune_main
from glm_port.finetune.toy_task import write_toy_task
from glm_port.outputs import OutputError, check_apart
from glm_port.pretrain_glm import main as pretrain_main

PRETRAIN = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--seq-length", "32",
            "--batch-size", "2", "--log-interval", "1", "--eval-iters", "0"]
FINETUNE = ["--max_steps", "1", "--logging_steps", "1", "--do_eval", "false", "--src_length", "12",
            "--tgt_length", "10", "--per_device_train_batch_size", "4"]


def snapshot(directory) -> dict:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def refused(main, argv, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 1, err
    assert " iteration " not in captured.out  # refused before the first step
    return err[0]


# ---- the rule ----------------------------------------------------------------------------------------------


def test_check_apart_is_the_rule_with_links_resolved(tmp_path):
    (tmp_path / "run" / "final").mkdir(parents=True)
    (tmp_path / "up").symlink_to(tmp_path / "run")
    (tmp_path / "other").mkdir()
    cases = [
        (tmp_path / "run", tmp_path / "run" / "final", "contains the input"),
        (tmp_path / "up", tmp_path / "run" / "final", "contains the input"),  # a link to the parent
        (tmp_path / "run" / "final" / "out", tmp_path / "run" / "final", "is inside the input"),
        (tmp_path / "up" / "final", tmp_path / "run" / "final", "the output cannot be the input"),
        (tmp_path / "run" / "file.txt", tmp_path / "run" / "file.txt", "the output cannot be the input"),
        (tmp_path / "run" / "away", tmp_path / "run", "is inside the input"),  # a link in SRC to elsewhere
    ]
    (tmp_path / "run" / "away").symlink_to(tmp_path / "other")
    for out, source, message in cases:
        with pytest.raises(OutputError, match=message):
            check_apart(out, [("SRC", source)])
    check_apart(tmp_path / "other", [("SRC", tmp_path / "run" / "final"), ("--lora_path", None)])
    check_apart(tmp_path / "run" / "final2", [("SRC", tmp_path / "run" / "final")])  # a sibling with a longer name


# ---- glm-finetune ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_tree(tmp_path_factory):
    """run/final (a real GLM directory: the embedded glm-tiny, saved), run/data/train.json, run/other.txt."""
    from glm_port.models.glm import finetune as binding

    root = tmp_path_factory.mktemp("finetune_outputs")
    model, vocab = binding.load(None, "cpu")
    binding.save(model, vocab, root / "run" / "final", None)
    train, dev = write_toy_task(root / "run" / "data")
    (root / "run" / "other.txt").write_text("the run's notes")
    return root / "run"


def test_finetune_never_writes_over_what_it_reads(tmp_path, run_tree, capsys):
    """--output_dir run with --model_name_or_path run/final used to train and then save over run/final."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_tree, run)
    train, dev = run / "data" / "train.json", run / "data" / "dev.json"
    cases = [
        (["--model_name_or_path", str(run / "final"), "--do_train", "--train_file", str(train), "--output_dir",
          str(run)], f"the output {run / 'final'} is the input --model_name_or_path"),
        (["--model_name_or_path", str(run), "--do_train", "--train_file", str(train), "--output_dir", str(run)],
         "is inside the input --model_name_or_path"),
        (["--lora_path", str(run / "final"), "--do_train", "--train_file", str(train), "--output_dir", str(run)],
         f"the output {run / 'final'} is the input --lora_path"),
        (["--do_train", "--train_file", str(run / "cache" / "t.json"), "--output_dir", str(run)],
         "contains the input --train_file"),
        (["--model_name_or_path", str(run / "final"), "--do_eval", "--eval_file", str(run / "eval_predictions.jsonl"),
          "--output_dir", str(run)], "is the input --eval_file"),
        (["--model_name_or_path", str(run / "final"), "--do_train", "--train_file", str(train), "--output_dir",
          str(tmp_path / "new"), "--merge_tensor_parallel_path", str(run)],
         "--merge_tensor_parallel_path " + str(run) + " contains the input --model_name_or_path"),
        (["--do_train", "--train_file", str(train), "--output_dir", str(tmp_path / "new"),
          "--merge_tensor_parallel_path", str(tmp_path / "new")], "contains the input --output_dir"),
    ]
    (run / "eval_predictions.jsonl").write_text('{"source": "a b", "target": "b a"}\n')
    (run / "cache").mkdir()
    (run / "cache" / "t.json").write_text('{"source": "a b", "target": "b a"}\n')
    before = snapshot(tmp_path)
    for argv, message in cases:
        err = refused(finetune_main, [*FINETUNE, *argv], capsys)
        assert err.startswith("glm-finetune: error:") and message in err, (argv, err)
        assert snapshot(tmp_path) == before
    assert not (tmp_path / "new").exists()


def test_finetune_evaluates_a_model_inside_its_output_dir(tmp_path, run_tree, capsys):
    """Evaluation alone writes only its results: run/final evaluated into run is no conflict."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(run_tree, run)
    (run / "dev.json").write_text('{"source": "a b", "target": "b a"}\n')
    before = snapshot(run / "final")
    finetune_main(["--model_name_or_path", str(run / "final"), "--do_eval", "--eval_file", str(run / "dev.json"),
                   "--output_dir", str(run), "--num_beams", "1", "--tgt_length", "2"])
    assert (run / "eval_results.json").is_file() and snapshot(run / "final") == before


def test_finetune_refuses_an_output_dir_it_cannot_write_before_loading(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    train = write_toy_task(tmp_path / "data")[0]
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "final").write_text("a file where the model goes")
    for out, message in [(tmp_path / "notes.txt", "--output_dir " + str(tmp_path / "notes.txt") + ": exists and is not a directory"),
                         (tmp_path / "out", "final: exists and is not a directory"),
                         (tmp_path / "notes.txt" / "sub", "notes.txt is a file, not a directory")]:
        err = refused(finetune_main, [*FINETUNE, "--do_train", "--train_file", str(train), "--output_dir", str(out)],
                      capsys)
        assert message in err, err
    assert (tmp_path / "notes.txt").read_text() == "mine"


# ---- glm-pretrain ------------------------------------------------------------------------------------------


def test_pretrain_refuses_a_save_it_cannot_write_before_the_first_step(tmp_path, capsys):
    """--save notes.txt trained the whole run, then died at the first save with a FileExistsError."""
    notes = tmp_path / "notes.txt"
    notes.write_text("mine")
    cases = [(["--save", str(notes)], "--save " + str(notes) + ": exists and is not a directory"),
             (["--save", str(notes / "ckpt")], "notes.txt is a file, not a directory"),
             (["--summary-dir", str(notes)], "--summary-dir " + str(notes) + ": exists and is not a directory")]
    for argv, message in cases:
        err = refused(pretrain_main, [*PRETRAIN, "--train-iters", "2", *argv], capsys)
        assert err.startswith("glm-pretrain: error:") and message in err, err
    assert notes.read_text() == "mine"


def test_pretrain_save_never_holds_what_it_reads(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "data").mkdir(parents=True)
    corpus = run / "data" / "corpus.jsonl"
    corpus.write_text("".join('{"text": "the cat sat on the mat and the dog sat on the log ' + str(i) + '"}\n'
                              for i in range(40)))
    (run / "other.txt").write_text("notes")
    before = snapshot(tmp_path)
    for save, message in [(run, "contains the input --train-data"), (run / "data", "contains the input --train-data")]:
        err = refused(pretrain_main, [*PRETRAIN, "--train-iters", "2", "--train-data", str(corpus), "--save",
                                      str(save)], capsys)
        assert message in err, err
        assert snapshot(tmp_path) == before
    # An upstream checkpoint (no architecture saved with it: iterations start again at 0) is not saved over.
    upstream = tmp_path / "upstream"
    (upstream / "5").mkdir(parents=True)
    (upstream / "latest_checkpointed_iteration.txt").write_text("5")
    torch.save({"module": {"word_embeddings.weight": torch.zeros(2, 2)}, "iteration": 5},
               upstream / "5" / "mp_rank_00_model_states.pt")
    err = refused(pretrain_main, [*PRETRAIN, "--train-iters", "2", "--load", str(upstream), "--save", str(upstream)],
                  capsys)
    assert "--save " + str(upstream) + " is the input --load" in err, err


# ---- the files' modes follow the umask ---------------------------------------------------------------------


def modes(directory) -> set[int]:
    return {stat.S_IMODE(p.stat().st_mode) for p in directory.rglob("*") if p.is_file()}


def test_written_model_files_follow_the_umask(tmp_path, run_tree, capsys):
    """safetensors writes its files 0600: the model files glm-merge, glm-export, glm-convert and glm-finetune
    write had that mode while the config beside them had the umask's."""
    from glm_port.convert.export import main as export_main
    from glm_port.convert.merge import main as merge_main
    from glm_port.convert.native import main as convert_main
    from glm_port.models.chatglm2.tiny import build_tiny
    from glm_port.models.chatglm2.finetune import save as save_chatglm2

    (tmp_path / "tokenizer").mkdir()
    save_chatglm2(*build_tiny(str(tmp_path / "tokenizer")), tmp_path / "chatglm2")
    old = os.umask(0o027)
    try:
        merge_main([str(run_tree / "final"), str(tmp_path / "merged")])
        export_main(["--model_name_or_path", str(run_tree / "final"), "--output_path", str(tmp_path / "served")])
        assert convert_main(["--to", "transformers", str(tmp_path / "chatglm2"), str(tmp_path / "hf")]) == 0
        finetune_main([*FINETUNE, "--do_train", "--train_file", str(run_tree / "data" / "train.json"),
                       "--output_dir", str(tmp_path / "ft")])
        finetune_main([*FINETUNE, "--lora", "--do_train", "--train_file", str(run_tree / "data" / "train.json"),
                       "--output_dir", str(tmp_path / "lora")])
    finally:
        os.umask(old)
    for written in ("merged", "served", "hf", "ft/final", "lora/final", "lora/base"):
        assert modes(tmp_path / written) == {0o640}, (written, sorted(map(oct, modes(tmp_path / written))))
        assert stat.S_IMODE((tmp_path / written).stat().st_mode) == 0o750, written


def test_the_corpus_cache_follows_the_umask(tmp_path, monkeypatch):
    from glm_port.data import get_tokenizer
    from glm_port.data.corpus import tokenize_file

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    corpus = tmp_path / "c.jsonl"
    corpus.write_text('{"text": "ada is the baker."}\n')
    old = os.umask(0o027)
    try:
        tokenize_file(corpus, get_tokenizer(), progress=False)
    finally:
        os.umask(old)
    (cache,) = tmp_path.glob("c.jsonl.*.glmcache.npz")
    assert stat.S_IMODE(cache.stat().st_mode) == 0o640  # mkstemp made it 0600


def test_an_unwritable_place_is_refused_before_any_work(tmp_path, monkeypatch):
    """(Run as root, nothing is unwritable: the permission check is made to answer no.)"""
    from glm_port.outputs import check_directory_output, check_file_output

    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if Path(path) == locked else real_access(path, mode))
    with pytest.raises(OutputError, match=r"cannot write in .*locked \(permission denied\)"):
        check_directory_output(locked / "out" / "deeper", "OUT")
    with pytest.raises(OutputError, match=r"--save .*locked: cannot write in it \(permission denied\)"):
        check_directory_output(locked, "--save")
    with pytest.raises(OutputError, match=r"cannot write in .*locked"):
        check_file_output(locked / "results.json")
