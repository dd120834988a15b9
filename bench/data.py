"""Throughput of glm_port's data pipeline: blank infilling (samples/s), whole batches, and tokenization.

Each line gives wall-clock rates and the CPU time this process used, which is the steadier number on a
shared machine.

    python -m bench.data                                  # embedded corpus, default tokenizer
    python -m bench.data --seq-length 512 --tokenizer-type GPT2BPETokenizer --tokenizer-path ../shared/vocab
"""

from __future__ import annotations

import argparse
import itertools
import time

from bench._measure import print_cpu_line
from glm_port.data import BlockMasker, build_train_batches, get_tokenizer, load_corpus, read_documents
from glm_port.data.batches import Windows
from glm_port.data.corpus import DEFAULT_CORPUS

MIXES = {
    "token spans (GLM-Large)": dict(bert_prob=1.0),
    "mixed 0.5/0.3/0.2 (GLM-10B)": dict(bert_prob=0.5, gap_sentence_prob=0.3, gpt_min_ratio=0.25, task_mask=True),
}


def rate(count: int, seconds: float) -> str:
    return f"{count / seconds:9.0f}/s"


class Timer:
    """Wall and CPU seconds of a block."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--samples", type=int, default=2000, help="samples to mask per measurement")
    parser.add_argument("--tokenizer-type", default=None)
    parser.add_argument("--tokenizer-path", default=None)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers for the batch measurement")
    args = parser.parse_args()

    print_cpu_line()
    tokenizer = get_tokenizer(args.tokenizer_type, args.tokenizer_path)
    documents = list(read_documents(DEFAULT_CORPUS))
    with Timer() as t:
        tokenizer.encode_batch(documents)
    size = DEFAULT_CORPUS.stat().st_size
    print(f"tokenize ({tokenizer.name}): {rate(len(documents), t.wall)} documents, {size / t.wall / 1e6:.1f} MB/s "
          f"(CPU {size / t.cpu / 1e6:.1f} MB/s)")

    corpus = load_corpus(None, tokenizer, progress=False)
    windows = Windows(corpus, args.seq_length, seed=0, cls_id=tokenizer.cls_id, eos_id=tokenizer.eos_id)
    inputs = [windows[i] for i in range(args.samples)]
    for name, knobs in MIXES.items():
        masker = BlockMasker(tokenizer, seed=0, seq_length=args.seq_length, **knobs)
        with Timer() as t:
            for i, window in enumerate(inputs):
                masker(window, index=i)
        print(f"mask {name:28s} seq {args.seq_length}: {rate(args.samples, t.wall)} samples "
              f"(CPU {1e6 * t.cpu / args.samples:.0f} us each)")

    batches = build_train_batches(None, tokenizer, seq_length=args.seq_length, batch_size=args.batch_size, seed=0,
                                  masker_kwargs=MIXES["mixed 0.5/0.3/0.2 (GLM-10B)"], num_workers=args.workers)
    next(batches)  # start-up (workers, first epoch) is not throughput
    count = max(1, args.samples // args.batch_size)
    with Timer() as t:
        for _ in itertools.islice(batches, count):
            pass
    print(f"batches of {args.batch_size} x {args.seq_length}, {args.workers} workers: {rate(count, t.wall)} batches, "
          f"{rate(count * args.batch_size, t.wall)} samples (CPU here {1e3 * t.cpu / count:.1f} ms a batch)")


if __name__ == "__main__":
    main()
