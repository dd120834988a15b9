"""Speed and memory figures, one script per question; each runs as ``python -m bench.NAME``
from the repository root (``--help`` says what it measures). Shared pieces: ``bench._measure``
(a fresh worker process per variant, peak RSS, the table), ``bench.peak_memory`` (wraps a
script and prints its peak), ``bench.pretrain`` (shapes, ``--vocab``/``--corpus``)."""
