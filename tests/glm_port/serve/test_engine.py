"""The engine's continuous batching, below HTTP: sequences that join a running batch and leave it early get
what they get alone, and the batch's cache keeps only the columns its running rows use."""

import threading
import time

import pytest

from glm_port.serve.engine import Engine, Sampling, Sequence


@pytest.fixture(scope="module")
def served(kit, one_thread):
    return kit.tiny_served()


def idle(engine, timeout=30):
    """Wait until the scheduler has dropped every finished row (it tells a sequence before it drops it)."""
    deadline = time.monotonic() + timeout
    while (engine.running or engine.cache is not None) and time.monotonic() < deadline:
        time.sleep(0.01)
    return not engine.running and engine.cache is None and engine.mask is None


def run(engine, prompt_ids, max_tokens, watch=None):
    done, events = threading.Event(), []

    def notify(event):
        events.append(event)
        if watch:
            watch(engine)
        if event.finish_reason:
            done.set()

    sequence = Sequence(prompt_ids, Sampling(max_tokens=max_tokens, temperature=0), notify, chat=False)
    engine.submit([sequence])
    return sequence, done, events


def test_join_and_leave_match_alone_and_the_cache_shrinks(served):
    engine = Engine(served, max_batch=8, batch_wait_ms=0)
    try:
        prompts = [served.encode_prompt("a " * n + "story") for n in (40, 3, 12, 25, 1)]
        lengths = [8, 30, 6, 20, 28]  # the long first prompt leaves early, the short ones run on
        alone = []
        for ids, n in zip(prompts, lengths):
            sequence, done, _ = run(engine, ids, n)
            assert done.wait(60)
            alone.append(sequence.generated)
            assert idle(engine)  # nothing kept between requests
        widths = []

        def watch(engine):  # called in the scheduler thread, between steps: the batch as it is
            if engine.mask is not None:
                lengths_now = [len(s.prompt_ids) + len(s.generated) for s in engine.running]
                widths.append((engine.mask.shape[1], max(lengths_now), len(engine.running)))

        first, done_first, _ = run(engine, prompts[0], lengths[0], watch)
        runs = [(first, done_first)]
        while len(first.generated) < 3:  # the others join a batch already decoding
            pass
        for ids, n in zip(prompts[1:], lengths[1:]):
            sequence, done, _ = run(engine, ids, n, watch)
            runs.append((sequence, done))
        for sequence, done in runs:
            assert done.wait(60)
        assert [s.generated for s, _ in runs] == alone
        assert max(rows for _, _, rows in widths) >= 3  # they ran together
        # the cache is never wider than the longest running row (+1 for a token fed but not yet counted),
        # so once the long first prompt has left, its columns are gone
        assert all(width <= longest + 1 for width, longest, _ in widths)
        assert idle(engine)
    finally:
        engine.close()


def test_cancelled_sequences_leave_at_the_next_step(served):
    engine = Engine(served, max_batch=4, batch_wait_ms=0)
    try:
        seen = []
        sequence, done, events = run(engine, served.encode_prompt("go"), 400,
                                     lambda e: seen.append(len(e.running)))
        while len(sequence.generated) < 5:
            pass
        engine.cancel([sequence])
        assert idle(engine)
        assert len(sequence.generated) < 50 and not done.is_set()
    finally:
        engine.close()
