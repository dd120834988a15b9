"""Upstream's entry points besides pretraining, on both sides: finetuning, evaluation, generation, resharding.

Each entry point (:data:`ENTRY_POINTS`) is one command of THUDM/GLM's own scripts
(``scripts/finetune_superglue.sh`` on RTE, COPA, BoolQ, CB, WiC, MultiRC, WSC (``--wsc-negative``), ReCoRD,
RTE with ``--multi-token`` and with ``--few-superglue``, CLUE's AFQMC, TNEWS, CLUEWSC on a checkpoint pretrained
with the Chinese SentencePiece tokenizer; ``scripts/finetune_seq2seq.sh`` on CNN/DM, XSum, Gigaword, question
generation and customization, ``scripts/finetune_blank.sh``; ``scripts/evaluate_lm.sh`` on LAMBADA (also left to
right), wikitext and plain text (``zero_lm.sh``, also left to right); ``scripts/evaluate_multichoice.sh``;
``generate_samples.py``, greedy and sampled;
``change_mp.py``; ``scripts/convert_glm_checkpoint_to_transformers.py``; ``pretrain_glm.py --load``) scaled down to the tiny model of :data:`harness.upstream.PRETRAIN_FLAGS`, on
small data written here in upstream's own formats (:func:`write_data`), from one pretrained
checkpoint both sides load (:func:`pretrained_checkpoint`, made by the migrated tree's own
``pretrain_glm.py --save``). :func:`run_entry` runs one entry point in the original tree under
glm-mock and in the migrated tree without it (apex and DeepSpeed unimportable), and reads the
figures each printed or wrote (:class:`Figures`): losses, accuracies, ROUGE, perplexity, the
generated text, the resharded tensors. :data:`MODES` says which also run at model-parallel size 2
(``tp2``); :data:`UPSTREAM_DEFECTS` the failures that are upstream's own, :data:`UPSTREAM_UNDEFINED` the figures
upstream leaves undefined (not compared); :data:`NOT_RUN` upstream's scripts that are not run here, and why.
:func:`run_entry` also runs :data:`DEEPSPEED_ENTRIES` with ``--deepspeed`` (a :func:`write_deepspeed_config` file;
DeepSpeed installed) and :data:`FP16_ENTRIES` with ``--fp16``. Dropout is off and the seed fixed, so the figures must be
equal (numbers within ``rtol``: the migrated loss rounds differently in the 7th digit).

Where glm_port has the job, its own code runs against upstream's entry point on the same weights and data:
:func:`run_glm_generate` (glm-generate, greedy) against ``generate`` on a :func:`silenced_checkpoint`;
:func:`seq2seq_first_step` gives finetune_glm.py's first seq2seq loss on one whole-split batch, which
:func:`upstream_seq2seq_sample` lays out for glm_port's model (tests/e2e/test_upstream_glm_port.py).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

from harness import upstream as up

# the tiny model of the pretraining flags, and what every entry point shares
MODEL_FLAGS = [
    "--block-lm", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4",
    "--max-position-embeddings", "128", "--tokenizer-type", "BertWordPieceTokenizer",
    "--tokenizer-model-type", "bert-base-uncased", "--distributed-backend", "gloo", "--seed", "1234",
    "--hidden-dropout", "0", "--attention-dropout", "0", "--num-workers", "0",
]  # fmt: skip
PRETRAIN_ITERS = 10
WORDS = ("the cat dog sat ran on a mat big small red blue house car tree bird flew over under near far "
         "green old young boy girl saw ate fish cake park river hill road").split()  # fmt: skip
GENERATE_PROMPTS = ["The cat sat on the [MASK] and the dog ran.", "A big red [MASK] flew over the house."]

# What the runs print (upstream's own formats)
FIGURE_LINES = [
    (re.compile(r"lm loss ([-+0-9.eE]+)"), "lm loss"),
    # SuperGLUE accuracy, seq2seq ROUGE (tasks/eval_utils.py: "total = N" then " KEY = X.XXXX" per metric): only
    # that, since under torchrun another rank's stderr can land on the same log line (a FutureWarning did)
    (re.compile(r">> \|epoch: (-?\d+)\| overall: (total = \d+(?: [\w-]+ = -?\d+\.\d{4})*)"), "overall"),
    (re.compile(r"number correct: (.*)$"), "lambada"),
    (re.compile(r"avg loss: (.*)$"), "wikitext"),
    (re.compile(r"^GLM: (.*)$"), "generated"),
]
NUMBER = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?$")


@dataclass
class Figures:
    """What one side's run of an entry point gave: (what, value) pairs in the order printed."""

    items: list[tuple[str, str]] = field(default_factory=list)

    def add(self, what: str, value: str) -> None:
        self.items.append((what, " ".join(value.split())))


@dataclass
class EntryPoint:
    name: str
    title: str
    command: str  # as docs/upstream.md's table shows it
    compared: str


ENTRY_POINTS = {
    e.name: e
    for e in [
        EntryPoint("resume", "pretrain_glm.py --load (its own --save)",
                   "pretrain_glm.py ... --save S --save-interval 2; pretrain_glm.py ... --load S",
                   "lm loss of the resumed iterations 3, 4"),
        EntryPoint("superglue", "finetune_glm.py, SuperGLUE RTE (cloze)",
                   "finetune_glm.py --finetune --cloze-eval --task RTE --pattern-id 0 --load-pretrained P "
                   "--checkpoint-activations --epochs 2",
                   "lm loss per iteration, dev accuracy per epoch, test accuracy"),
        EntryPoint("copa", "finetune_glm.py, SuperGLUE COPA (multiple choice)",
                   "finetune_glm.py --finetune --cloze-eval --task COPA --pattern-id 0 --load-pretrained P --epochs 2",
                   "lm loss per iteration, dev accuracy per epoch"),
        EntryPoint("boolq", "finetune_glm.py, SuperGLUE BoolQ (cloze, task_boolq.sh's pattern 4)",
                   "finetune_glm.py --finetune --cloze-eval --task BoolQ --pattern-id 4 --load-pretrained P --epochs 2",
                   "lm loss per iteration, dev accuracy per epoch"),
        EntryPoint("cb", "finetune_glm.py, SuperGLUE CB (cloze, three labels)",
                   "finetune_glm.py --finetune --cloze-eval --task CB --pattern-id 0 --load-pretrained P --epochs 2",
                   "lm loss per iteration, dev accuracy per epoch"),
        EntryPoint("wic", "finetune_glm.py, SuperGLUE WiC (cloze)",
                   "finetune_glm.py --finetune --cloze-eval --task WiC --pattern-id 0 --load-pretrained P --epochs 2",
                   "lm loss per iteration, dev accuracy per epoch"),
        EntryPoint("multirc", "finetune_glm.py, SuperGLUE MultiRC (cloze, task_multirc.sh's pattern 0)",
                   "finetune_glm.py --finetune --cloze-eval --task MultiRC --pattern-id 0 --load-pretrained P --epochs 2",
                   "lm loss per iteration, dev F1a, EM and accuracy per epoch"),
        EntryPoint("wsc", "finetune_glm.py, SuperGLUE WSC (task_wsc.sh: --wsc-negative --loss-func mix, pattern 2)",
                   "finetune_glm.py --finetune --cloze-eval --task WSC --wsc-negative --loss-func mix --length-penalty 1 "
                   "--pattern-id 2 --load-pretrained P --epochs 2",
                   "lm loss per iteration, dev accuracy per epoch"),
        EntryPoint("record", "finetune_glm.py, SuperGLUE ReCoRD (entity candidates, task_record.sh's pattern 0)",
                   "finetune_glm.py --finetune --cloze-eval --task ReCoRD --pattern-id 0 --load-pretrained P --epochs 2",
                   "lm loss per iteration, dev EM and F1 per epoch"),
        EntryPoint("rte_mt", "finetune_glm.py, SuperGLUE RTE with --multi-token (the multi-token cloze model and data)",
                   "finetune_glm.py --finetune --cloze-eval --task RTE --pattern-id 0 --multi-token --load-pretrained P "
                   "--epochs 2",
                   "lm loss per iteration, dev accuracy per epoch, test accuracy"),
        EntryPoint("rte_few", "finetune_glm.py, SuperGLUE RTE with --few-superglue (dev from dev32.jsonl, test from val.jsonl)",
                   "finetune_glm.py --finetune --cloze-eval --task RTE --pattern-id 0 --few-superglue --load-pretrained P "
                   "--epochs 2",
                   "lm loss per iteration, dev accuracy per epoch, test accuracy (labelled: val.jsonl)"),
        EntryPoint("afqmc", "finetune_glm.py, CLUE AFQMC (cloze, Chinese SentencePiece, task_afqmc.sh's pattern 0)",
                   "finetune_glm.py --finetune --cloze-eval --task afqmc --pattern-id 0 --load-pretrained P_ZH --epochs 2",
                   "lm loss per iteration, dev accuracy per epoch"),
        EntryPoint("tnews", "finetune_glm.py, CLUE TNEWS (cloze, 15 labels, task_tnews.sh's pattern 0, --multi-token)",
                   "finetune_glm.py --finetune --cloze-eval --task tnews --pattern-id 0 --multi-token --load-pretrained P_ZH "
                   "--epochs 2",
                   "lm loss per iteration, dev accuracy per epoch"),
        EntryPoint("cluewsc", "finetune_glm.py, CLUE CLUEWSC (cloze, task_cluewsc.sh's pattern 0)",
                   "finetune_glm.py --finetune --cloze-eval --task cluewsc --pattern-id 0 --load-pretrained P_ZH --epochs 2",
                   "lm loss per iteration, dev accuracy per epoch"),
        EntryPoint("seq2seq", "finetune_glm.py, seq2seq (CNN/DM format) with beam search",
                   "finetune_glm.py --finetune --task cnn_dm_original --load-pretrained P --num-beams 2 --epochs 1",
                   "lm loss per iteration, ROUGE-1/2/L, the beam-search summary of each test document (test.jsonl.hyps)"),
        EntryPoint("xsum", "finetune_glm.py, XSum (seq_xsum.sh: BBC .summary files and the split JSON)",
                   "finetune_glm.py --finetune --task xsum --load-pretrained P --num-beams 2 --epochs 1",
                   "lm loss per iteration, ROUGE-1/2/L, the beam-search summary of each test document"),
        EntryPoint("gigaword", "finetune_glm.py, Gigaword (seq_gigaword.sh: its -lrb- tokenized text)",
                   "finetune_glm.py --finetune --task gigaword --load-pretrained P --num-beams 2 --epochs 1",
                   "lm loss per iteration, ROUGE-1/2/L, the beam-search headline of each test document"),
        EntryPoint("squad_generation", "finetune_glm.py, question generation (seq_squad_generation.sh, SQuAD JSON)",
                   "finetune_glm.py --finetune --task squad_generation --load-pretrained P --num-beams 2 --epochs 1",
                   "lm loss per iteration, ROUGE-1/2/L, the generated question of each test answer"),
        EntryPoint("squad", "finetune_glm.py, SQuAD 2.0 (seq_squad.sh)",
                   "finetune_glm.py --finetune --task squad --load-pretrained P --num-beams 2 --validation-metric F1 "
                   "--epochs 1",
                   "lm loss per iteration, EM and F1 per evaluation (upstream's own failure on both sides, UPSTREAM_DEFECTS)"),
        EntryPoint("squad_v1", "finetune_glm.py, SQuAD 1.1 extractive QA as generation (seq_squad_v1.sh)",
                   "finetune_glm.py --finetune --task squad_v1 --load-pretrained P --num-beams 2 --validation-metric F1 "
                   "--epochs 1",
                   "lm loss per iteration, EM and F1 per evaluation, the answer to each question"),
        EntryPoint("blank", "finetune_glm.py, blank infilling (finetune_blank.sh, seq_blank.sh, mask ratio 0.1)",
                   "finetune_glm.py --finetune --task blank --blank-maskratio 0.1 --load-pretrained P --epochs 1",
                   "lm loss per iteration, the filled text of each test line"),
        EntryPoint("customization", "finetune_glm.py, customization (seq_customization.sh: your .source/.target)",
                   "finetune_glm.py --finetune --task customization --load-pretrained P --num-beams 2 --epochs 1",
                   "lm loss per iteration, ROUGE-1/2/L, the beam-search output of each test source"),
        EntryPoint("zero_lm", "zero-shot language-model perplexity (evaluate_lm.sh, zero_lm.sh)",
                   "finetune_glm.py --finetune --task language_model --valid-data lm-test.txt --overlapping-eval 32 "
                   "--load-pretrained P",
                   "avg loss, ppl, adjusted ppl"),
        EntryPoint("zero_lm_uni", "zero-shot language-model perplexity, left to right (evaluate_lm.sh, zero_lm_uni.sh)",
                   "finetune_glm.py --finetune --task language_model --valid-data lm-test.txt --overlapping-eval 32 "
                   "--unidirectional --load-pretrained P",
                   "avg loss, ppl, adjusted ppl"),
        EntryPoint("lambada_uni", "zero-shot LAMBADA, left to right (evaluate_lm.sh, zero_lambada_uni.sh)",
                   "finetune_glm.py --finetune --task lambda --valid-data lambada_test.jsonl --unidirectional "
                   "--load-pretrained P",
                   "number correct, accuracy"),
        EntryPoint("multichoice", "zero-shot multiple choice (evaluate_multichoice.sh, its JSON lines)",
                   "finetune_glm.py --finetune --cloze-eval --task multichoice --test-data mc/*.jsonl --epochs 0 "
                   "--load-pretrained P",
                   "accuracy"),
        EntryPoint("lambada", "zero-shot LAMBADA (evaluate_lm.sh, zero_lambada.sh)",
                   "finetune_glm.py --finetune --task lambda --valid-data lambada_test.jsonl --load-pretrained P",
                   "number correct, accuracy"),
        EntryPoint("wikitext", "zero-shot wikitext perplexity (evaluate_lm.sh, zero_wikitext.sh)",
                   "finetune_glm.py --finetune --task wikitext --valid-data wiki.test.tokens --overlapping-eval 32 "
                   "--load-pretrained P",
                   "avg loss, ppl, adjusted ppl"),
        EntryPoint("generate", "generate_samples.py (greedy, prompts on stdin)",
                   "generate_samples.py --load-pretrained P --top-k 1 --out-seq-length 16 < prompts",
                   "the generated text of each prompt"),
        EntryPoint("generate_topk", "generate_samples.py (top-k 40 sampling, as generate_block.sh; seed 1234)",
                   "generate_samples.py --load-pretrained P --temperature 0.9 --top-k 40 --out-seq-length 16 < prompts",
                   "the sampled text of each prompt"),
        EntryPoint("change_mp", "change_mp.py (model-parallel 1 -> 2)",
                   "change_mp.py P 2",
                   "every tensor of both new shards, byte for byte (SHA-256), and the kept keys"),
        EntryPoint("convert", "scripts/convert_glm_checkpoint_to_transformers.py",
                   "scripts/convert_glm_checkpoint_to_transformers.py P/ITER/mp_rank_00_model_states.pt glm-large",
                   "every tensor of the pytorch_model.bin it writes, byte for byte (SHA-256)"),
    ]
}


# CLUE: the Chinese model's tokenizer flags (config_tasks/model_blocklm_large_chinese.sh), on a checkpoint
# pretrained with them (pretrained_checkpoint(..., chinese=True)); upstream reads its SentencePiece model
# from chinese_sentencepiece/cog-pretrain.model in the tree (THUDM/GLM ships it)
CLUE_TASKS = ("afqmc", "tnews", "cluewsc")
CHINESE_TOKENIZER = ["--task-mask", "--tokenizer-type", "ChineseSPTokenizer", "--fix-command-token"]
SUPERGLUE_TASKS = {"superglue": ("RTE", "0"), "copa": ("COPA", "0"), "boolq": ("BoolQ", "4"), "cb": ("CB", "0"),
                   "wic": ("WiC", "0"), "multirc": ("MultiRC", "0"), "wsc": ("WSC", "2"),
                   "record": ("ReCoRD", "0"), "rte_mt": ("RTE", "0"),
                   "rte_few": ("RTE", "0"), "afqmc": ("afqmc", "0"), "tnews": ("tnews", "0"),
                   "cluewsc": ("cluewsc", "0")}  # entry -> (upstream's task name, --pattern-id)
# flags besides the pattern: task_wsc.sh's TRAIN_ARGS; --multi-token and --few-superglue (no config_tasks file passes
# them; --multi-token on RTE, since COPA, WSC, MultiRC and ReCoRD's patterns are multi-token whatever it says)
SUPERGLUE_EXTRA = {"wsc": ["--loss-func", "mix", "--wsc-negative", "--length-penalty", "1"],
                   "rte_mt": ["--multi-token"], "rte_few": ["--few-superglue"],
                   # task_tnews.sh's single-token cloze stops in upstream itself, on both sides, at TNewsPVP's
                   # verbalizer check: "AssertionError: Verbalization "居家" does not correspond to a single
                   # token" (the shipped chinese_sentencepiece model splits it); multi-token cloze takes it
                   "tnews": ["--multi-token"]}
# seq2seq's tasks (config_tasks/seq_*.sh)
SEQ2SEQ_TASKS = {"seq2seq": "cnn_dm_original", "xsum": "xsum", "gigaword": "gigaword",
                 "squad_generation": "squad_generation", "squad": "squad", "squad_v1": "squad_v1", "blank": "blank",
                 "customization": "customization"}
# not distributed: change_mp.py and the converter are one-process scripts (no torch.distributed, no mpu);
# every other entry point runs at --model-parallel-size 2 too
ONE_PROCESS = ("change_mp", "convert")
# the modes each entry point runs in: "1" one process; "tp2" torchrun 2 with --model-parallel-size 2
MODES = {name: ("1",) if name in ONE_PROCESS else ("1", "tp2") for name in ENTRY_POINTS}
# --deepspeed (scripts/ds_*.sh, config/ds_block_*.sh, task_record.sh): DeepSpeed's engine where it is installed
# (the opt-in tests/e2e/test_upstream_deepspeed.py): pretraining (resume: --save, then --load, both through the
# engine's own checkpoints) and SuperGLUE RTE's finetuning, each from a config write_deepspeed_config writes
DEEPSPEED_ENTRIES = ("resume", "superglue")
# --fp16 (every config_tasks/model_blocklm_*.sh passes it): upstream's own fp16 path (FP16_Module: the model in half;
# fp16/fp16.py's FP16_Optimizer with fp32 master weights and loss_scaler.py's dynamic loss scale) runs on the CPU
# (torch 2.13 has half matmul, layer norm and softmax there): SuperGLUE RTE's finetuning (tests/e2e/test_upstream_fp16.py)
FP16_ENTRIES = ("superglue",)
# upstream's scripts that are not entry points here, and why (they need what cannot be had)
NOT_RUN = {
    "scripts/evaluate_seq2seq.sh": "not Python: Stanford CoreNLP's PTBTokenizer (Java, a jar from stanford.edu) and "
                                   "the files2rouge command (a ROUGE-1.5.5 Perl install); finetune_glm.py's own "
                                   "ROUGE of the same hypotheses is compared in the seq2seq runs",
}
# Failures that are upstream's own, on any hardware, and the same on both sides: (entry, mode) -> the error.
# Model parallel, every seq2seq task: tasks/seq2seq/finetune.py:147 calls finetune() without a model_type, so
# train_utils.py:85-86 leave parallel_output=True and GLMModel (model/modeling_glm.py:130-131) returns this rank's
# vocab-parallel logits (seq2seq's training loss takes them to mpu.vocab_parallel_cross_entropy, rightly); the beam
# search (tasks/seq2seq/evaluate.py:294-325, DecoderEvaluater; :436-451, BlankLMEvaluater) takes them as the whole
# vocabulary, and MinLengthLogitsProcessor (generation_utils.py:440, ``scores[:, self.eos_token_id] = -inf``) indexes
# eop (30523) past the rank's part (30524 padded to 30592, a multiple of 128 * 2: 15296 a rank).
# seq_squad.sh: finetune_glm.py sends --task squad to tasks/superglue (its PROCESSORS lists "squad", tried before the
# seq2seq tasks), whose only squad metric is accuracy; the script's --validation-metric F1 is not one of them.
SEQ2SEQ_TP2 = "IndexError: index 30523 is out of bounds for dimension 1 with size 15296"
# Figures upstream leaves undefined, the same defect without a failure: (entry, mode) -> (the figure kind not
# compared, why). seq_blank.sh (--min-tgt-length 0, so no MinLengthLogitsProcessor) runs to its end at model-parallel
# size 2, its greedy fill taken from each rank's vocabulary part as above; BlankLMEvaluater then has both ranks
# store.set() each uid in one TCPStore (tasks/seq2seq/evaluate.py:412-414, 495-496; its world size is the data-parallel
# one), so the filled line written is whichever rank set it last (rank 0's part: "american american ..."; rank 1's
# local index 15227, its eop, read as "##inas"), a race. Its training losses are compared. seq_squad_v1.sh (also
# --min-tgt-length 0) runs to its end too, its answers made the same way but gathered by all_gather_object, the last
# rank's kept (evaluate.py:381-383): undefined as well, but the same on both sides, so compared. In all of them the
# training loss at model-parallel size 2 is not mode 1's: label smoothing's log_softmax (tasks/seq2seq/finetune.py:46-48)
# runs over the rank's vocabulary part.
UPSTREAM_UNDEFINED = {
    ("blank", "tp2"): ("summary", "upstream's vocab-parallel greedy fill, and a race between the two ranks' "
                                  "TCPStore.set of each line (tasks/seq2seq/evaluate.py:495-496)"),
}
UPSTREAM_DEFECTS = {
    **{(name, "tp2"): SEQ2SEQ_TP2 for name in SEQ2SEQ_TASKS if name not in ("squad", "squad_v1", "blank")},
    ("squad", "1"): "KeyError: 'F1'",
    ("squad", "tp2"): "KeyError: 'F1'",
}


def write_deepspeed_config(path: Path, name: str) -> Path:
    """A DeepSpeed config for entry point ``name`` (:data:`DEEPSPEED_ENTRIES`) in the layout of upstream's
    (``config_tasks/config_blocklm_10B.json``, ``config/config_block_base.json``), scaled to the tiny runs:
    its micro batch, learning rate and weight decay are the entry point's own flags (upstream's ``arguments.py``
    reads them from this file when ``--deepspeed`` is given). Left out, for the CPU: ``fp16`` (the tiny runs are
    fp32) and ZeRO's ``cpu_offload`` (its DeepSpeedCPUAdam is a C++ op DeepSpeed compiles); ``torch_adam``, so that
    DeepSpeed's ``Adam`` is torch's AdamW rather than its FusedAdam op (a CUDA/C++ build)."""
    lr, weight_decay = {"resume": (1e-3, 0.01), "superglue": (1e-4, 0.1)}[name]
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 100,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "Adam", "params": {"lr": lr, "betas": [0.9, 0.98], "eps": 1e-6,
                                                 "weight_decay": weight_decay, "torch_adam": True}},
        "activation_checkpointing": {"partition_activations": False, "contiguous_memory_optimization": False},
        "wall_clock_breakdown": False,
    }  # fmt: skip
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return path


def _sentence(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n)).capitalize() + "."


def _jsonl(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def write_data(root: Path) -> Path:
    """Small seeded data in upstream's formats under ``root``: SuperGLUE ``RTE/``, ``COPA/``, ``BoolQ/``,
    ``CB/``, ``WiC/`` (``{train,val,test}.jsonl``), seq2seq ``s2s/{train,val,test}.{source,target}`` (upstream reads
    the dev split from ``val.*``), LAMBADA ``lm/lambada_test.jsonl`` (``{"text"}`` lines; the last
    word is the target), wikitext ``lm/wiki.test.tokens``. The same bytes every time."""
    rng = random.Random(0)
    root = Path(root)
    for split, n in (("train", 16), ("val", 8), ("test", 8)):
        rows = []
        for i in range(n):
            row = {"premise": _sentence(rng, 8), "hypothesis": _sentence(rng, 5), "idx": i}
            if split != "test":
                row["label"] = rng.choice(["entailment", "not_entailment"])
            rows.append(row)
        _jsonl(root / "RTE" / f"{split}.jsonl", rows)
        rows = []
        for i in range(n):
            row = {"premise": _sentence(rng, 7)[:-1] + ".", "choice1": _sentence(rng, 4), "choice2": _sentence(rng, 4),
                   "question": rng.choice(["cause", "effect"]), "idx": i}  # fmt: skip
            if split != "test":
                row["label"] = rng.randint(0, 1)
            rows.append(row)
        _jsonl(root / "COPA" / f"{split}.jsonl", rows)
        rows = []
        for i in range(n):
            row = {"passage": " ".join(_sentence(rng, 8) for _ in range(2)), "question": _sentence(rng, 5)[:-1].lower(),
                   "idx": i}  # fmt: skip
            if split != "test":
                row["label"] = rng.random() < 0.5
            rows.append(row)
        _jsonl(root / "BoolQ" / f"{split}.jsonl", rows)
        rows = []
        for i in range(n):
            row = {"premise": _sentence(rng, 8), "hypothesis": _sentence(rng, 5), "idx": i}
            if split != "test":
                row["label"] = rng.choice(["entailment", "contradiction", "neutral"])
            rows.append(row)
        _jsonl(root / "CB" / f"{split}.jsonl", rows)
        rows = []
        for i in range(n):
            word = rng.choice(WORDS)
            first, second = _sentence(rng, 6)[:-1] + f" {word}.", f"{word.capitalize()} " + _sentence(rng, 6).lower()
            row = {"word": word, "sentence1": first, "sentence2": second, "start1": len(first) - len(word) - 1,
                   "end1": len(first) - 1, "start2": 0, "end2": len(word), "idx": i}  # fmt: skip
            if split != "test":
                row["label"] = rng.random() < 0.5
            rows.append(row)
        _jsonl(root / "WiC" / f"{split}.jsonl", rows)
    _write_more_superglue(root)
    (root / "s2s").mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 8), ("val", 4), ("test", 4)):
        sources = [" ".join(_sentence(rng, 8) for _ in range(3)) for _ in range(n)]
        (root / "s2s" / f"{split}.source").write_text("".join(s + "\n" for s in sources), encoding="utf-8")
        targets = [s.split(".")[0] + "." for s in sources]  # the first sentence: a summary to learn
        (root / "s2s" / f"{split}.target").write_text("".join(t + "\n" for t in targets), encoding="utf-8")
    _jsonl(root / "lm" / "lambada_test.jsonl",
           [{"text": " ".join(_sentence(rng, rng.randint(6, 10)) for _ in range(3))[:-1]} for _ in range(8)])
    lines = ["", " = Title = ", ""] + [" " + " ".join(_sentence(rng, rng.randint(6, 12)) for _ in range(4)) + " "
                                      for _ in range(20)]  # fmt: skip
    (root / "lm" / "wiki.test.tokens").write_text("\n".join(lines) + "\n", encoding="utf-8")
    _write_more_seq2seq(root)
    return root


def _write_more_seq2seq(root: Path) -> None:
    """The other seq2seq tasks' data, the zero-shot LM text and multiple-choice lines, from a generator of their own
    (the data written before keeps its bytes): XSum (``xsum/``: one BBC ``ID.summary`` per document, ``[SN]KEY[SN]``
    sections, and ``XSum-TRAINING-DEV-TEST-SPLIT-90-5-5.json``), Gigaword (``gigaword/{split}.{source,target}``,
    lower-cased, ``-lrb-`` brackets), question generation (``squad_generation/{train,dev,test}.json``: SQuAD's
    ``data/paragraphs/qas``), blank infilling (``blank/{train,valid,test}.txt`` and the test lines with ``<blank>``
    spans, ``blank/blank/test.maskratio0.1.blank``), customization (``customization/{split}.{source,target}``),
    ``lm/lm-test.txt`` (zero_lm.sh's plain text) and ``mc/test.jsonl`` (evaluate_multichoice.sh's
    ``inputs_pretokenized``, ``choices_pretokenized``, ``label``)."""
    rng = random.Random(2)
    split_ids: dict[str, list[str]] = {}
    for split, n in (("train", 8), ("validation", 2), ("test", 4)):
        split_ids[split] = []
        for i in range(n):
            doc = f"{split[:2]}{i:03d}"
            body = [_sentence(rng, 8) for _ in range(3)]
            text = (f"[SN]URL[SN]\nhttp://www.bbc.co.uk/news/{doc}\n\n[SN]TITLE[SN]\n{_sentence(rng, 4)}\n\n"
                    f"[SN]FIRST-SENTENCE[SN]\n{body[0]}\n\n[SN]RESTBODY[SN]\n" + "\n".join(body) + "\n")  # fmt: skip
            (root / "xsum").mkdir(parents=True, exist_ok=True)
            (root / "xsum" / f"{doc}.summary").write_text(text, encoding="utf-8")
            split_ids[split].append(doc)
    (root / "xsum" / "XSum-TRAINING-DEV-TEST-SPLIT-90-5-5.json").write_text(json.dumps(split_ids), encoding="utf-8")
    for task in ("gigaword", "customization"):
        (root / task).mkdir(parents=True, exist_ok=True)
        for split, n in (("train", 8), ("val", 2), ("test", 4)):
            sources = [" ".join(_sentence(rng, 8) for _ in range(2)) for _ in range(n)]
            targets = [s.split(".")[0] for s in sources]
            if task == "gigaword":  # Gigaword's own tokenization: lower case, brackets spelled out
                sources = [f"-lrb- {s.lower()} -rrb-" for s in sources]
                targets = [t.lower() for t in targets]
            for ext, lines in (("source", sources), ("target", targets)):
                (root / task / f"{split}.{ext}").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
    (root / "squad_generation").mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 4), ("dev", 2), ("test", 2)):
        paragraphs = []
        for _ in range(n):
            context = " ".join(_sentence(rng, 7) for _ in range(3))
            answer = context.split()[rng.randint(1, 5)]
            paragraphs.append({"context": context, "qas": [{"question": _sentence(rng, 5)[:-1] + "?", "id": str(len(paragraphs)),
                                                            "answers": [{"text": answer}]}]})  # fmt: skip
        (root / "squad_generation" / f"{split}.json").write_text(json.dumps({"data": [{"paragraphs": paragraphs}]}),
                                                                  encoding="utf-8")  # fmt: skip
    (root / "squad").mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 4), ("dev", 2)):  # SQuAD 2.0 (seq_squad.sh; its test split is dev-v2.0.json too)
        paragraphs = []
        for p in range(n):
            context = " ".join(_sentence(rng, 7) for _ in range(3)).lower()
            words = context.split()
            answer = words[rng.randint(1, 5)]
            qas = [{"id": f"{split}-{p}-0", "question": _sentence(rng, 5)[:-1].lower() + "?", "is_impossible": False,
                    "answers": [{"text": answer, "answer_start": context.index(answer)}]},
                   {"id": f"{split}-{p}-1", "question": _sentence(rng, 5)[:-1].lower() + "?", "is_impossible": True,
                    "answers": []}]  # fmt: skip
            paragraphs.append({"context": context, "qas": qas})
        (root / "squad" / f"{split}-v2.0.json").write_text(json.dumps({"version": "v2.0", "data": [
            {"title": "t", "paragraphs": paragraphs}]}), encoding="utf-8")  # fmt: skip
        v1 = [{**p, "qas": [q for q in p["qas"] if q["answers"]]} for p in paragraphs]  # SQuAD 1.1: all answerable
        (root / "squad_v1").mkdir(parents=True, exist_ok=True)
        (root / "squad_v1" / f"{split}-v1.1.json").write_text(json.dumps({"version": "1.1", "data": [
            {"title": "t", "paragraphs": v1}]}), encoding="utf-8")  # fmt: skip
    (root / "blank" / "blank").mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 8), ("valid", 2), ("test", 2)):
        lines = [" ".join(_sentence(rng, 10) for _ in range(2)) for _ in range(n)]
        (root / "blank" / f"{split}.txt").write_text("".join(x + "\n" for x in lines), encoding="utf-8")
        if split == "test":  # one span of each line blanked
            blanked = []
            for line in lines:
                words = line.split()
                start = rng.randint(1, len(words) - 3)
                blanked.append(" ".join(words[:start] + ["<blank>"] + words[start + 2:]))
            (root / "blank" / "blank" / "test.maskratio0.1.blank").write_text("".join(x + "\n" for x in blanked),
                                                                             encoding="utf-8")  # fmt: skip
    # documents longer than --seq-length 128, so that the windows overlap (where --unidirectional differs)
    (root / "lm" / "lm-test.txt").write_text("".join(" ".join(_sentence(rng, rng.randint(6, 12)) for _ in range(18)) + "\n"
                                                     for _ in range(4)), encoding="utf-8")  # fmt: skip
    rows = []
    for _ in range(8):
        choices = [_sentence(rng, 2)[:-1].lower() for _ in range(3)]
        rows.append({"inputs_pretokenized": _sentence(rng, 8)[:-1] + " because", "choices_pretokenized": choices,
                     "label": rng.randint(0, 2)})  # fmt: skip
    _jsonl(root / "mc" / "test.jsonl", rows)


def _write_more_superglue(root: Path) -> None:
    """RTE's ``dev32.jsonl`` (``--few-superglue``), MultiRC, WSC (WSC-negative: with ``candidates``) and ReCoRD in SuperGLUE's JSON lines, from a generator of
    their own (the tasks written before keep their bytes)."""
    rng = random.Random(1)
    rows = [{"premise": _sentence(rng, 8), "hypothesis": _sentence(rng, 5), "idx": i,
             "label": rng.choice(["entailment", "not_entailment"])} for i in range(8)]  # fmt: skip
    _jsonl(root / "RTE" / "dev32.jsonl", rows)  # --few-superglue's dev split (FewGLUE's name)
    for split, n in (("train", 4), ("val", 2), ("test", 2)):
        rows = []
        for p in range(n):  # MultiRC: a passage, 2 questions, 2 answers each (one example per answer)
            questions = []
            for q in range(2):
                answers = []
                for a in range(2):
                    answer = {"text": _sentence(rng, 3), "idx": a}
                    if split != "test":
                        answer["label"] = rng.randint(0, 1)
                    answers.append(answer)
                questions.append({"question": _sentence(rng, 5)[:-1] + "?", "idx": 2 * p + q, "answers": answers})
            rows.append({"idx": p, "passage": {"text": " ".join(_sentence(rng, 7) for _ in range(3)),
                                               "questions": questions}})  # fmt: skip
        _jsonl(root / "MultiRC" / f"{split}.jsonl", rows)
    nouns = ["cat", "dog", "boy", "girl", "bird", "fish"]
    for split, n in (("train", 12), ("val", 8), ("test", 4)):
        rows = []
        for i in range(n):  # WSC: "The X saw the Y because it ..." with the pronoun at word 6
            x, y, *others = rng.sample(nouns, 4)
            words = ["The", x, "saw", "the", y, "because", "it", *(_sentence(rng, 4)[:-1].lower().split())]
            words[-1] += "."
            row = {"text": " ".join(words), "idx": i, "candidates": [{"text": f"the {o}"} for o in (y, *others)],
                   "target": {"span1_text": f"The {x}", "span1_index": 0, "span2_text": "it", "span2_index": 6}}  # fmt: skip
            if split != "test":
                row["label"] = rng.random() < 0.75
            rows.append(row)
        _jsonl(root / "WSC" / f"{split}.jsonl", rows)
    _write_clue(root, rng)
    names = ["Alice", "Bob", "Carol", "Dave", "Eve"]
    for split, n in (("train", 8), ("val", 4), ("test", 4)):
        rows = []
        for i in range(n):  # ReCoRD: entity spans (inclusive ends) in the passage; the query's @placeholder
            people = rng.sample(names, 3)
            text = f"{people[0]} met {people[1]} and {people[2]}. " + _sentence(rng, 6) + "\n@highlight\n" + _sentence(rng, 4)
            entities = [{"start": text.index(e), "end": text.index(e) + len(e) - 1} for e in people]
            answer = rng.choice(people)
            qa = {"query": f"@placeholder " + _sentence(rng, 4).lower(), "idx": i}
            if split != "test":
                qa["answers"] = [{"start": text.index(answer), "end": text.index(answer) + len(answer) - 1,
                                  "text": answer}]  # fmt: skip
            rows.append({"idx": i, "passage": {"text": text, "entities": entities}, "qas": [qa]})
        _jsonl(root / "ReCoRD" / f"{split}.jsonl", rows)


HANZI = "我你他她它们是的不在有人这中大来上国个到说时要就出会可也对生能而子那得于着下自之年过发后作里用道行所然家种事成方多经么去法学如都同现当没动面起看定天分还进好小部其些主样理心本前开但因只从想实日军者意无力它与长把机十民第公此已工使情明性知全三又关点正业外将两高间由问很最重并物手应战向头文体政美相见被利什二等产或新己制身果加西斯月话合回特代内信表化老给世位次度门任常先海通教儿原东声提立及比员解水名真论处走义各入几口认条平系气题活尔更别打女变四神总何电数安少报才结反受目太量再感建务"  # common characters


def _hanzi(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(HANZI) for _ in range(n))


def _write_clue(root: Path, rng: random.Random) -> None:
    """CLUE's AFQMC, TNEWS and CLUEWSC in their own JSON lines (``{train,dev,test}.json``), Chinese text."""
    tnews_labels = ["100", "101", "102", "103", "104", "106", "107", "108", "109", "110", "112", "113", "114", "115",
                    "116"]  # fmt: skip
    for split, n in (("train", 8), ("dev", 8), ("test", 4)):
        rows = []
        for i in range(n):
            row = {"sentence1": _hanzi(rng, 10), "sentence2": _hanzi(rng, 10)}
            if split != "test":
                row["label"] = rng.choice(["0", "1"])
            rows.append(row)
        _jsonl(root / "afqmc" / f"{split}.json", rows)
        rows = []
        for i in range(n):
            row = {"sentence": _hanzi(rng, 14), "keywords": ",".join(_hanzi(rng, 2) for _ in range(3))}
            if split != "test":
                row["label"] = rng.choice(tnews_labels)
            rows.append(row)
        _jsonl(root / "tnews" / f"{split}.json", rows)
        rows = []
        for i in range(n):  # the pronoun 他 at character 8, the noun at 0 (2 characters)
            text = _hanzi(rng, 8) + "他" + _hanzi(rng, 6) + "。"
            row = {"text": text, "idx": i, "target": {"span1_text": text[:2], "span1_index": 0, "span2_text": "他",
                                                       "span2_index": 8}}  # fmt: skip
            if split != "test":
                row["label"] = rng.choice(["true", "false"])
            rows.append(row)
        _jsonl(root / "cluewsc" / f"{split}.json", rows)


def _launch(side: str, script: str, mode: str = "1", deepspeed: bool = False) -> list[str]:
    """How ``script`` starts on ``side``: one process, or (``tp2``) two under torchrun. The migrated tree runs
    with apex and DeepSpeed unimportable; with ``deepspeed`` (``--deepspeed`` runs) apex only."""
    from harness.verify import ABSENT

    absent = ",".join(p for p in ABSENT.split(",") if p != "deepspeed") if deepspeed else ABSENT
    own = [script] if side == "original" else ["-m", "harness.without", absent, script]
    if mode == "1":
        return [sys.executable, *own]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(up.free_port()), *own]  # fmt: skip


def _one_process_env(env: dict) -> dict:
    return {**env, "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(up.free_port()), "TERM": "dumb"}  # fmt: skip


def chinese_flags(flags: list[str]) -> list[str]:
    """``flags`` with BERT WordPiece's tokenizer flags replaced by the Chinese model's (:data:`CHINESE_TOKENIZER`)."""
    out = list(flags)
    for flag in ("--tokenizer-type", "--tokenizer-model-type"):
        if flag in out:
            i = out.index(flag)
            del out[i:i + 2]
    return out + CHINESE_TOKENIZER


def pretrained_checkpoint(ported: Path, env: dict, workdir: Path, timeout: int, iters: int = PRETRAIN_ITERS,
                          chinese: bool = False) -> Path:  # fmt: skip
    """The directory ``--load-pretrained`` takes: the migrated tree trains the tiny model
    ``iters`` (:data:`PRETRAIN_ITERS`) iterations and saves it (upstream's layout: ``NAME/ITER/mp_rank_00_model_states.pt``).
    ``chinese``: with the Chinese model's SentencePiece tokenizer (:data:`CHINESE_TOKENIZER`), for the CLUE tasks."""
    from harness.verify import EXTRA_FLAGS

    save = Path(workdir) / ("pretrained" if iters == PRETRAIN_ITERS else f"pretrained-{iters}")
    if chinese:
        save = save.with_name(save.name + "-zh")
    if save.exists():
        shutil.rmtree(save)
    flags = [*up.PRETRAIN_FLAGS, *EXTRA_FLAGS, "--train-iters", str(iters), "--save", str(save),
             "--experiment-name", "tiny"]  # fmt: skip
    if chinese:
        flags = chinese_flags(flags)
    cmd = _launch("ported", "pretrain_glm.py") + flags
    code, text = up.run_upstream(cmd, ported, _one_process_env(env), save.with_suffix(".log"), timeout)
    found = sorted(save.glob("*/latest_checkpointed_iteration.txt"))
    if code != 0 or not found:
        from harness.verify import failure_cause

        raise up.HarnessError(f"pretraining the checkpoint failed: {failure_cause(code, text)} (log: {save.with_suffix('.log')})")
    return found[0].parent


# glm-generate against generate_samples.py (greedy): the tiny model trained longer, then its end-of-piece
# and "." rows of the (tied) word embeddings zeroed, since greedy decoding of the tiny model otherwise
# ends every blank at once (eop is its likeliest first token) or repeats "." to the end: with them at
# logit 0, both fill each blank with 16 tokens that change along the way. BERT WordPiece ids
# (docs/upstream.md): eop 30523 (sop 30522), "." 1012.
GLM_GENERATE_ITERS = 200
SOP_TEXT = "<|startofpiece|>"
SILENCED_TOKENS = (30523, 1012)


def silenced_checkpoint(pretrained: Path, workdir: Path, rows: tuple[int, ...] = SILENCED_TOKENS) -> Path:
    """A copy of ``pretrained`` (one ``mp_rank_00`` shard) with the word-embedding ``rows`` zeroed: the
    weights both glm-generate and generate_samples.py load in :func:`run_glm_generate`'s comparison.
    Loads with ``weights_only=False``: the file is the one this harness's own pretraining wrote."""
    import torch

    copy = Path(workdir) / "pretrained-silenced" / pretrained.name
    if copy.parent.exists():
        shutil.rmtree(copy.parent)
    shutil.copytree(pretrained, copy)
    [shard] = copy.glob("*/mp_rank_00_model_states.pt")
    sd = torch.load(shard, map_location="cpu", weights_only=False)
    with torch.no_grad():
        sd["module"]["word_embeddings.weight"][list(rows)] = 0
    torch.save(sd, shard)
    write_config(copy, sd["module"]["word_embeddings.weight"].shape[0])
    return copy


def _flag(name: str) -> int:
    return int(MODEL_FLAGS[MODEL_FLAGS.index(name) + 1])


def write_config(checkpoint: Path, vocab_size: int) -> Path:
    """``config.json`` (THUDM's field names) beside upstream's ``mp_rank_XX`` files, from :data:`MODEL_FLAGS`:
    those files carry no architecture, and glm-generate reads the heads off this file (without one it takes
    them 64 wide, as every GLM release: 1 head for the tiny model's 4; docs/generation.md). Upstream's
    scripts do not read it (they take the flags)."""
    config = {"model_type": "glm", "num_layers": _flag("--num-layers"), "hidden_size": _flag("--hidden-size"),
              "num_attention_heads": _flag("--num-attention-heads"), "vocab_size": vocab_size,
              "max_sequence_length": _flag("--max-position-embeddings"), "block_position_encoding": True,
              "attention_scale": 1.0, "relative_encoding": False}  # fmt: skip
    path = Path(checkpoint) / "config.json"
    path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return path


def wordpiece_text(ids: list[int], vocab: Path) -> str:
    """``ids`` as upstream's BertWordPieceTokenizer.DecodeIds writes them: the vocabulary's tokens,
    ``##`` pieces joined to the one before, the rest separated by one space."""
    tokens = Path(vocab).read_text(encoding="utf-8").split("\n")
    words: list[str] = []
    for i in ids:
        token = tokens[i]
        if token.startswith("##") and words:
            words[-1] += token[2:]
        else:
            words.append(token)
    return " ".join(words)


def run_glm_generate(checkpoint: Path, vocab: Path, env: dict, workdir: Path, timeout: int) -> SideRun:
    """glm_port's ``glm-generate --json`` (greedy) on :data:`GENERATE_PROMPTS` from upstream's checkpoint
    directory, its figures written as generate_samples.py prints them (``generated``: ``<|startofpiece|>``
    and each blank's tokens, :func:`wordpiece_text`) so :class:`EntryComparison` compares them with
    the ``generate`` entry point's; plus ``ids`` (each blank's token ids) for the report."""
    from harness.verify import failure_cause

    log = Path(workdir) / "glm-generate.log"
    cmd = [sys.executable, "-m", "glm_port.generation.cli", "--model", str(checkpoint), "--json",
           "--tokenizer-type", "BertWordPieceTokenizer", "--tokenizer-path", str(vocab),
           "--max-new-tokens", "16", "--device", "cpu", *GENERATE_PROMPTS]  # fmt: skip
    code, text = up.run_upstream(cmd, up.PROJECT_ROOT, env, log, timeout)
    figures = Figures()
    if code == 0:
        try:
            rows = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
            for row in rows:
                [ids] = row["generated_ids"]  # one blank a prompt
                figures.add("generated", " ".join([SOP_TEXT, wordpiece_text(ids, vocab)]))
        except (ValueError, KeyError) as exc:
            code, text = 1, text + f"\n[harness] cannot read glm-generate's --json output: {exc}"
    return SideRun(code, figures, log, failure_cause(code, text) if code else "")


# finetune_glm.py's seq2seq loss on its first step, against glm_port's: the whole training split in one
# batch (its token-mean loss does not depend on the sampler's order), label smoothing as seq_cnndm_org.sh.
SEQ2SEQ_SRC, SEQ2SEQ_TGT, SEQ2SEQ_SMOOTHING = 64, 16, 0.1


def seq2seq_first_step(side: str, tree: Path, env: dict, data: Path, pretrained: Path, workdir: Path,
                       timeout: int) -> SideRun:  # fmt: skip
    """finetune_glm.py's seq2seq run of the ``seq2seq`` entry point with ``--batch-size`` = every training
    sample, so that its first step's batch is the whole split; figures: the ``lm loss`` of each iteration."""
    from harness.verify import failure_cause

    samples = len((Path(data) / "s2s" / "train.source").read_text(encoding="utf-8").splitlines())
    flags = _finetune_flags("seq2seq", data, pretrained, Path(workdir) / f"seq2seq-batch.{side}" / "save")
    flags[flags.index("--batch-size") + 1] = str(samples)
    log = Path(workdir) / f"seq2seq-batch.{side}.log"
    code, text = up.run_upstream(_launch(side, "finetune_glm.py") + flags, tree, _one_process_env(env), log, timeout)
    figures = Figures()
    if code == 0:
        read_figures(text, figures)
        figures.items = [(w, v) for w, v in figures.items if w == "lm loss"]
    return SideRun(code, figures, log, failure_cause(code, text) if code else "")


def upstream_seq2seq_sample(source_ids: list[int], target_ids: list[int], ids: dict) -> dict:
    """One training sample as upstream's ``finetune_glm.py --task cnn_dm_original`` lays it out, as
    docs/upstream.md describes: ``[CLS] [MASK]`` + `` Content:`` + source, cut and padded with ``[PAD]`` to
    :data:`SEQ2SEQ_SRC` (all of it bidirectional: ``sep`` is that length), then ``[sop]`` + target, whose
    labels are target + ``[eop]``, cut and padded to :data:`SEQ2SEQ_TGT`, the loss on the labels only.
    ``source_ids`` start with `` Content:``'s ids; ``ids``: the ``cls``, ``mask``, ``pad``, ``sop``, ``eop`` ids."""
    source = [ids["cls"], ids["mask"], *source_ids][:SEQ2SEQ_SRC]
    source += [ids["pad"]] * (SEQ2SEQ_SRC - len(source))
    labels = [*target_ids, ids["eop"]][:SEQ2SEQ_TGT]
    counted = len(labels)
    labels += [ids["pad"]] * (SEQ2SEQ_TGT - len(labels))
    mask_position = source.index(ids["mask"])
    return {"text": source + [ids["sop"]] + labels[:-1], "target": [0] * SEQ2SEQ_SRC + labels,
            "loss_mask": [0] * SEQ2SEQ_SRC + [1] * counted + [0] * (SEQ2SEQ_TGT - counted), "sep": SEQ2SEQ_SRC,
            "position_id": [list(range(SEQ2SEQ_SRC)) + [mask_position] * SEQ2SEQ_TGT,
                            [0] * SEQ2SEQ_SRC + list(range(1, SEQ2SEQ_TGT + 1))]}  # fmt: skip


def pretrained_mp2(ported: Path, env: dict, pretrained: Path, workdir: Path, timeout: int) -> Path:
    """``pretrained`` split for model-parallel size 2 by the migrated tree's own ``change_mp.py``
    (what the ``tp2`` runs load)."""
    from harness.verify import failure_cause

    copy = Path(workdir) / f"{pretrained.parent.name}-mp" / pretrained.name  # pretrained-mp, pretrained-zh-mp
    if copy.parent.exists():
        shutil.rmtree(copy.parent)
    shutil.copytree(pretrained, copy)
    log = Path(workdir) / f"{pretrained.parent.name}-mp2.log"
    code, text = up.run_upstream(_launch("ported", "change_mp.py") + [str(copy), "2"], ported, _one_process_env(env),
                                 log, timeout)  # fmt: skip
    if code != 0:
        raise up.HarnessError(f"change_mp.py to model-parallel size 2 failed: {failure_cause(code, text)} (log: {log})")
    return copy.parent / f"{copy.name}_MP2"


def _finetune_flags(name: str, data: Path, pretrained: Path, save: Path) -> list[str]:
    common = [*MODEL_FLAGS, "--finetune", "--load-pretrained", str(pretrained), "--save", str(save),
              "--experiment-name", name, "--overwrite"]  # fmt: skip
    if name in CLUE_TASKS:
        common = chinese_flags(common)
    if name in SUPERGLUE_TASKS:
        task, pattern = SUPERGLUE_TASKS[name]
        extra = (["--checkpoint-activations"] if name == "superglue" else []) + SUPERGLUE_EXTRA.get(name, [])
        return [*common, "--cloze-eval", "--task", task, "--data-dir", str(data / task), "--seq-length", "64",
                "--eval-batch-size", "4", "--save-epoch", "100000", "--lr-decay-style", "linear", "--warmup", "0.1",
                "--weight-decay", "1.0e-1", "--pattern-id", pattern, "--save-interval", "10000", "--log-interval", "1",
                "--eval-interval", "10000000", "--eval-iters", "100", "--batch-size", "4", "--epochs", "2",
                "--lr", "1e-4", *extra]  # fmt: skip
    if name in SEQ2SEQ_TASKS and name != "seq2seq":  # seq_<task>.sh's flags, scaled down as seq2seq's
        beams = [] if name == "blank" else ["--num-beams", "2", "--select-topk", "--no-repeat-ngram-size", "3"]
        extra = {"blank": ["--blank-maskratio", "0.1"], "squad": ["--validation-metric", "F1"],
                 "squad_v1": ["--validation-metric", "F1"]}.get(name, [])
        # at least 4 tokens (seq_xsum.sh asks 10, the others 0): the 10-iteration model would end every output
        # at once, and the comparison would be of empty strings
        min_length = "0" if name in ("blank", "squad", "squad_v1") else "4"
        return [*common, "--task", SEQ2SEQ_TASKS[name], "--data-dir", str(data / name), "--epochs", "1",
                "--batch-size", "4", "--lr", "1e-4", "--lr-decay-style", "linear", "--warmup", "0.06",
                "--weight-decay", "1.0e-1", "--label-smoothing", "0.1", "--save-interval", "10000",
                "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "100", "--eval-epoch", "1",
                "--src-seq-length", "64", "--tgt-seq-length", "16", "--min-tgt-length", min_length, "--length-penalty", "0.7",
                *beams, "--eval-batch-size", "1", "--seq-length", "80", "--checkpoint-activations", *extra]  # fmt: skip
    if name in ("zero_lm", "zero_lm_uni"):  # zero_lm.sh, zero_lm_uni.sh (--unidirectional)
        return [*common, "--task", "language_model", "--valid-data", str(data / "lm" / "lm-test.txt"),
                "--eval-batch-size", "4", "--seq-length", "128", "--overlapping-eval", "32",
                *(["--unidirectional"] if name == "zero_lm_uni" else [])]  # fmt: skip
    if name == "lambada_uni":  # zero_lambada_uni.sh
        return [*common, "--task", "lambda", "--valid-data", str(data / "lm" / "lambada_test.jsonl"),
                "--eval-batch-size", "4", "--seq-length", "128", "--unidirectional"]  # fmt: skip
    if name == "multichoice":
        return [*common, "--cloze-eval", "--task", "multichoice", "--test-data", str(data / "mc" / "*.jsonl"),
                "--seq-length", "64", "--checkpoint-activations", "--eval-batch-size", "4", "--no-load-optim",
                "--no-load-lr-scheduler", "--epochs", "0"]  # fmt: skip
    if name == "seq2seq":
        return [*common, "--task", "cnn_dm_original", "--data-dir", str(data / "s2s"), "--epochs", "1",
                "--batch-size", "4", "--lr", "1e-4", "--lr-decay-style", "linear", "--warmup", "0.06",
                "--weight-decay", "1.0e-1", "--label-smoothing", "0.1", "--save-interval", "10000",
                "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "100", "--eval-epoch", "1",
                "--src-seq-length", "64", "--tgt-seq-length", "16", "--min-tgt-length", "8", "--length-penalty", "0.7",
                "--no-repeat-ngram-size", "3", "--num-beams", "2", "--select-topk", "--eval-batch-size", "1",
                "--seq-length", "80", "--checkpoint-activations"]  # fmt: skip
    if name == "lambada":
        return [*common, "--task", "lambda", "--valid-data", str(data / "lm" / "lambada_test.jsonl"),
                "--eval-batch-size", "4", "--seq-length", "128"]  # fmt: skip
    if name == "wikitext":
        return [*common, "--task", "wikitext", "--valid-data", str(data / "lm" / "wiki.test.tokens"),
                "--eval-batch-size", "4", "--seq-length", "128", "--overlapping-eval", "32"]  # fmt: skip
    raise ValueError(name)


@dataclass
class SideRun:
    code: int
    figures: Figures
    log: Path
    cause: str = ""


def read_figures(text: str, figures: Figures) -> None:
    for line in text.splitlines():
        line = line.strip()
        for pattern, what in FIGURE_LINES:
            for m in pattern.finditer(line):
                figures.add(what, " ".join(g for g in m.groups()))


def shard_digest(directory: Path) -> list[tuple[str, str]]:
    """(what, value) for every ``mp_rank_*`` file under ``directory``: each tensor of its ``module``
    (shape and SHA-256 of its bytes) and every other key's type. Loads with ``weights_only=False``:
    the files are the ones this harness's own runs wrote."""
    import torch

    out = []
    for path in sorted(Path(directory).rglob("mp_rank_*_model_states.pt")):
        sd = torch.load(path, map_location="cpu", weights_only=False)
        rel = path.relative_to(directory)
        for key in sorted(k for k in sd if k != "module"):
            out.append((f"{rel} {key}", type(sd[key]).__name__))
        out += tensor_digest(sd["module"], f"{rel} module.")
    return out


def tensor_digest(state_dict: dict, prefix: str = "") -> list[tuple[str, str]]:
    """(name, "shape sha256-prefix") for every tensor of ``state_dict``, sorted by name."""
    out = []
    for key, tensor in sorted(state_dict.items()):
        data = tensor.detach().contiguous().cpu().numpy().tobytes()
        out.append((f"{prefix}{key}", f"{tuple(tensor.shape)} {hashlib.sha256(data).hexdigest()[:16]}"))
    return out


def run_entry(name: str, side: str, tree: Path, env: dict, data: Path, pretrained: Path, workdir: Path,
              timeout: int, mode: str = "1", deepspeed: Path | None = None, fp16: str = "") -> SideRun:  # fmt: skip
    """Run entry point ``name`` in ``tree`` (``side``: "original" under ``env`` with the mock,
    "ported" without) and read its figures. ``mode`` ``tp2``: two processes under torchrun with
    ``--model-parallel-size 2``, ``pretrained`` then being a checkpoint of that size (:func:`pretrained_mp2`).
    ``deepspeed``: a DeepSpeed config (:func:`write_deepspeed_config`); the run gets ``--deepspeed
    --deepspeed_config`` it (DeepSpeed's engine: it must be installed; the migrated side may import it).
    ``fp16``: with ``--fp16`` (upstream's FP16_Module and FP16_Optimizer), on the CPU too: "dynamic" (its dynamic loss
    scaler, the scripts' way) or a static ``--loss-scale`` ("1024")."""
    from harness.verify import EXTRA_FLAGS, failure_cause

    if mode not in MODES[name]:
        raise ValueError(f"{name} does not run in mode {mode}")
    if deepspeed is not None and name not in DEEPSPEED_ENTRIES:
        raise ValueError(f"{name} does not run with --deepspeed here (only {', '.join(DEEPSPEED_ENTRIES)})")
    if fp16 and (name not in FP16_ENTRIES or fp16 != "dynamic" and not fp16.isdigit()):
        raise ValueError(f"{name} does not run with --fp16 {fp16} here (only {', '.join(FP16_ENTRIES)}; dynamic or N)")
    tag = f"{name}.{mode}{'.ds' if deepspeed else ''}{f'.fp16-{fp16}' if fp16 else ''}.{side}"
    out = Path(workdir) / tag
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    log = Path(workdir) / f"{tag}.log"
    env = _one_process_env(env)
    mode_flags = ["--model-parallel-size", "2"] if mode == "tp2" else []
    if deepspeed is not None:
        mode_flags += ["--deepspeed", "--deepspeed_config", str(deepspeed)]
    if fp16:
        mode_flags += ["--fp16"] if fp16 == "dynamic" else ["--fp16", "--loss-scale", fp16]

    def launch(side: str, script: str, mode: str = "1") -> list[str]:
        return _launch(side, script, mode, deepspeed is not None)

    figures = Figures()
    stdin = None
    if name == "resume":
        save = out / "save"
        flags = [*up.PRETRAIN_FLAGS, *EXTRA_FLAGS, "--train-iters", "4", *mode_flags]
        code, text = up.run_upstream(launch(side, "pretrain_glm.py", mode) + flags + ["--save", str(save), "--save-interval", "2"],
                                     tree, env, log, timeout)  # fmt: skip
        if code == 0:
            [run_dir] = [p.parent for p in save.glob("*/latest_checkpointed_iteration.txt")]
            (run_dir / "latest_checkpointed_iteration.txt").write_text("2")  # as if stopped after iteration 2
            log = log.with_name(f"{tag}.load.log")
            code, text = up.run_upstream(launch(side, "pretrain_glm.py", mode) + flags + ["--load", str(run_dir)],
                                         tree, env, log, timeout)  # fmt: skip
            if code == 0 and f"{run_dir}/2/mp_rank_00_model_states.pt" not in text:
                code, text = 1, text + "\n[harness] the second run did not load the checkpoint of iteration 2"
    elif name == "change_mp":
        source = out / "checkpoint"
        shutil.copytree(pretrained, source)
        code, text = up.run_upstream(launch(side, "change_mp.py") + [str(source), "2"], tree, env, log, timeout)
        if code == 0:
            for what, value in shard_digest(out / "checkpoint_MP2"):
                figures.add(what, value)
    elif name == "convert":
        source = out / "checkpoint"
        shutil.copytree(pretrained, source)
        [shard] = source.glob("*/mp_rank_00_model_states.pt")
        code, text = up.run_upstream(launch(side, "scripts/convert_glm_checkpoint_to_transformers.py")
                                     + [str(shard), "glm-large"], tree, env, log, timeout)  # fmt: skip
        if code == 0:
            import torch

            converted = torch.load(shard.with_name("pytorch_model.bin"), map_location="cpu", weights_only=True)
            for what, value in tensor_digest(converted, "pytorch_model.bin "):
                figures.add(what, value)
    elif name in ("generate", "generate_topk"):
        stdin = "".join(p + "\n" for p in GENERATE_PROMPTS) + "stop\n"
        top_k = "1" if name == "generate" else "40"  # greedy; or scripts/generate_block.sh's sampling
        flags = [*MODEL_FLAGS, "--load-pretrained", str(pretrained), "--DDP-impl", "none", *mode_flags,
                 "--out-seq-length", "16", "--seq-length", "64", "--temperature", "0.9", "--top-k", top_k, "--top-p", "0"]  # fmt: skip
        code, text = up.run_upstream(launch(side, "generate_samples.py", mode) + flags, tree, env, log, timeout,
                                     stdin=stdin)  # fmt: skip
    else:
        if name == "squad_v1":
            env = {**env, **offline_bert_tokenizer(tree, out)}
        hyps = tree / "runs" / name / "test.jsonl.hyps"  # the seq2seq test predictions, one a line (log dir)
        if hyps.exists():
            hyps.unlink()
        flags = _finetune_flags(name, data, pretrained, out / "save") + mode_flags
        code, text = up.run_upstream(launch(side, "finetune_glm.py", mode) + flags, tree, env, log, timeout)
        if code == 0 and name == "squad_v1":  # its output_func writes {question id: answer} JSON, then .refs
            for key, answer in sorted(json.loads(hyps.with_suffix("").read_text(encoding="utf-8")).items()):
                figures.add("answer", f"{key} {answer}")
        elif code == 0 and name in SEQ2SEQ_TASKS:
            for line in hyps.read_text(encoding="utf-8").splitlines():
                figures.add("summary", line)
    if code == 0:
        before = list(figures.items)
        figures.items = []
        read_figures(text, figures)
        figures.items += before
    return SideRun(code, figures, log, failure_cause(code, text) if code else "")


def offline_bert_tokenizer(tree: Path, out: Path) -> dict:
    """The environment under which ``transformers.AutoTokenizer.from_pretrained("bert-base-uncased")`` (the seq2seq
    SQuADProcessor of seq_squad_v1.sh) loads without a download: a Hugging Face cache under ``out`` holding that repository's tokenizer,
    made from the BERT vocabulary the tree already reads (``.pytorch_pretrained_bert/``, bert-base-uncased's own),
    and the hub offline."""
    home = Path(out) / "hf"
    repo = home / "hub" / "models--bert-base-uncased"
    revision = "0" * 40
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(revision, encoding="utf-8")
    shutil.copyfile(Path(tree) / up.VOCAB_CACHE, snapshot / "vocab.txt")
    (snapshot / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True,
                                                                "model_max_length": 512}), encoding="utf-8")  # fmt: skip
    (snapshot / "config.json").write_text(json.dumps({"model_type": "bert"}), encoding="utf-8")
    return {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def same(a: str, b: str, rtol: float) -> bool:
    """Two figure values agree: word by word, numbers within ``rtol`` (relative), the rest exactly."""
    wa, wb = a.split(), b.split()
    if len(wa) != len(wb):
        return False
    for x, y in zip(wa, wb):
        if NUMBER.match(x) and NUMBER.match(y):
            fx, fy = float(x), float(y)
            if abs(fx - fy) > rtol * max(abs(fx), abs(fy), 1e-30):
                return False
        elif x != y:
            return False
    return True


@dataclass
class EntryComparison:
    name: str
    original: SideRun
    ported: SideRun
    rtol: float
    mode: str = "1"
    problems: list[str] = field(default_factory=list)
    defect: str = ""  # upstream's own failure, the same on both sides (UPSTREAM_DEFECTS)
    undefined: str = ""  # figures upstream leaves undefined, not compared (UPSTREAM_UNDEFINED)

    def __post_init__(self):
        known = UPSTREAM_DEFECTS.get((self.name, self.mode))
        if known and all(r.code != 0 and known in r.cause for r in (self.original, self.ported)):
            self.defect = known
            return
        for side, r in (("original", self.original), ("ported", self.ported)):
            if r.code != 0:
                self.problems.append(f"{side} run failed: {r.cause or f'exit status {r.code}'} (log: {r.log})")
        if self.problems:
            return
        a, b = self.original.figures.items, self.ported.figures.items
        undefined = UPSTREAM_UNDEFINED.get((self.name, self.mode))
        if undefined:  # upstream's own: not compared (the rest is)
            a, b = ([x for x in items if x[0] != undefined[0]] for items in (a, b))
            self.undefined = f"{undefined[0]} not compared: {undefined[1]}"
        if not a:
            self.problems.append(f"no figures printed (log: {self.original.log})")
        if [w for w, _ in a] != [w for w, _ in b]:
            self.problems.append(f"{len(a)} figures in the original, {len(b)} in the ported run, or in another order")
            return
        for (what, x), (_, y) in zip(a, b):
            if not same(x, y, self.rtol):
                self.problems.append(f"{what}: {x!r} (original) vs {y!r} (ported)")

    @property
    def ok(self) -> bool:
        return not self.problems


def summary(figures: Figures, limit: int = 3) -> str:
    """A short account of a run's figures for the table: the first and last of each kind, counted."""
    kinds: dict[str, list[str]] = {}
    for what, value in figures.items:
        if what.startswith("pytorch_model.bin "):
            key = "tensor"
        else:
            key = ("tensor" if " module." in what else "kept key") if "mp_rank_" in what else what
        kinds.setdefault(key, []).append(value)
    parts = []
    for what, values in kinds.items():
        if what in ("tensor", "kept key"):
            parts.append(f"{len(values)} {what}s")
        elif len(values) == 1:
            parts.append(f"{what} {values[0][:60]}")
        else:
            parts.append(f"{what} x{len(values)}: {values[0][:40]} ... {values[-1][:40]}")
    return "; ".join(parts[:limit + 2])


def table(comparison: EntryComparison) -> str:
    entry = ENTRY_POINTS[comparison.name]
    where = ", torchrun 2, --model-parallel-size 2" if comparison.mode == "tp2" else ""
    lines = [f"## {entry.title}{where}", "", f"compared: {entry.compared}"]
    if comparison.original.code == 0 and comparison.ported.code == 0:
        lines.append(f"original: {summary(comparison.original.figures)}")
        lines.append(f"ported:   {summary(comparison.ported.figures)}")
        lines.append(f"{len(comparison.original.figures.items)} figures each")
    if comparison.defect:
        lines.append(f"UPSTREAM: both sides fail alike, upstream's own defect: {comparison.defect}")
        return "\n".join(lines)
    if comparison.undefined:
        lines.append(f"UPSTREAM: {comparison.undefined}")
    verdict = "MATCH" if comparison.ok else "MISMATCH"
    lines.append(f"{verdict} (rtol {comparison.rtol:g})" + "".join(f"\n  - {x}" for x in comparison.problems))
    return "\n".join(lines)

