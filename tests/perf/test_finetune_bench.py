"""bench.finetune's ChatGLM2 rows: the six variants parse, build what glm-finetune trains, and every trained
weight gets a gradient (speed itself is the bench's job, not a test's)."""

import pytest

from bench.finetune import PTUNING, VARIANTS, parse, speed_jobs, summarize, worker

SIX = ["full", "full+recompute", "lora", "lora+recompute", "ptuning", "ptuning+projection"]


def test_chatglm2_shapes_run_all_six_variants_and_glm_shapes_skip_p_tuning():
    args = parse(["--shapes", "chatglm2-small", "small", "--rounds", "2"])
    assert list(VARIANTS) == SIX and args.pre_seq_len == 128  # THUDM ptuning/train.sh's PRE_SEQ_LEN
    jobs = speed_jobs(args)
    assert jobs[:10] == [f"speed=chatglm2-small:{v}" for v in SIX] + [f"speed=small:{v}" for v in SIX[:4]]
    assert jobs[10:] == jobs[:10]  # round after round


@pytest.mark.parametrize("argv", [["--shapes", "small", "--variants", "ptuning"], ["--rounds", "0"],
                                  ["--pre-seq-len", "0"], ["--variants", "prefix"]])
def test_bad_flags_are_refused(argv, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse(argv)
    assert exit_.value.code == 2


@pytest.mark.parametrize("variant", SIX)
def test_each_chatglm2_variant_trains_what_glm_finetune_trains(variant):
    import torch

    torch.set_num_threads(1)
    args = parse(["--shapes", "chatglm2-tiny", "--steps", "1", "--warmup", "0", "--no-tracker",
                  "--pre-seq-len", "4", "--device", "cpu"])
    result = worker(f"chatglm2-tiny:{variant}", args)
    layers, groups, head = 2, 2, 128 // 4
    prefix = 4 * layers * 2 * groups * head  # the prefix embedding: pre_seq_len x (L * 2 * G * d)
    expected = {"ptuning": prefix,
                "ptuning+projection": prefix + (256 * 128 + 128) + (128 * 256 + 256),  # Linear-Tanh-Linear
                "lora": layers * 8 * (128 + 256), "lora+recompute": layers * 8 * (128 + 256)}  # r 8 on qkv 128->256
    assert result["trainable"] == expected.get(variant, result["total"])
    assert result["no_grad"] == 0  # recompute around a frozen base still reaches the adapters
    assert result["first_loss"] > 0 and result["samples_s"] > 0


def test_rounds_give_medians_and_the_spread():
    def run(rate, rss):
        return {"shape": "chatglm2-tiny", "variant": "lora", "trainable": 1, "total": 2, "no_grad": 0,
                "first_loss": 1.0, "step_s": 8 / rate, "samples_s": rate, "tokens_s": rate * 23,
                "peak_rss_mib": rss, "rise_rss_mib": rss / 2}

    (row,) = summarize([run(4.0, 100.0), run(8.0, 300.0), run(6.0, 200.0)])
    assert (row["samples_s"], row["samples_min"], row["samples_max"], row["peak_rss_mib"], row["rounds"]) == \
        (6.0, 4.0, 8.0, 200.0, 3)
