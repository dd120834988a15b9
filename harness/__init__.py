"""The upstream harness: run an unmodified THUDM/GLM checkout, under glm-mock or migrated.

Its own room, above ``migrate`` (it runs the codemod and the mock) and beside ``bench``:

- ``harness.upstream``: what every run shares, re-exported here: upstream's tiny flags
  (:data:`PRETRAIN_FLAGS`), its log lines (:data:`LOSS`, :data:`ELAPSED`), a writable copy of a
  checkout (:func:`prepare_tree`), where it reads ``--train-data test`` (:func:`corpus_path`) and
  that corpus written from the vocabulary (:func:`ensure_corpus`, :func:`checkout_corpus`),
  the vocabulary (:func:`find_vocab`: ``--vocab``, ``$GLM_VOCAB`` or the checkout's own), the
  environments (:func:`mock_env`, :func:`ported_env`), one logged run (:func:`run_upstream`),
  :func:`free_port`;
- ``harness.selfcheck``: the checkout under glm-mock (``python -m harness.selfcheck GLM``,
  also ``python -m migrate.mock.selfcheck``);
- ``harness.verify``: the checkout against its migration (``glm-migrate --verify GLM``,
  also ``python -m harness.verify``);
- ``harness.without``: run a script as if some packages were not installed.

Nothing here names a path outside the repository; bad input raises :class:`HarnessError`
(the commands print it on one line and exit with status 2).
"""

from harness.upstream import (
    ELAPSED, LOSS, MPU_TESTS, PRETRAIN_FLAGS, UPSTREAM_DEFECTS, VOCAB_ENV, VOCAB_NAME, HarnessError, check_checkout,
    checkout_corpus, corpus_path, ensure_corpus, find_vocab, free_port, mock_env, ported_env, prepare_tree,
    run_upstream,
)  # fmt: skip

__all__ = [
    "ELAPSED", "LOSS", "MPU_TESTS", "PRETRAIN_FLAGS", "UPSTREAM_DEFECTS", "VOCAB_ENV", "VOCAB_NAME", "HarnessError",
    "check_checkout", "checkout_corpus", "corpus_path", "ensure_corpus", "find_vocab", "free_port", "mock_env",
    "ported_env", "prepare_tree", "run_upstream",
]  # fmt: skip
