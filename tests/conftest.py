"""Helpers the test directories share; a test module imports them with ``from ..conftest import NAME``
(files that also run as scripts, as ``tests/distributed/conftest.py`` does, import from the package named).

- :func:`free_port`: a free TCP port on 127.0.0.1 for MASTER_PORT / ``torchrun --master_port``; the
  one implementation is ``harness.free_port``, which the harness and the benches use too.
- Whether a tensor is a DTensor, and its local piece: ``shim.is_global`` and ``shim.to_local``.
- The fixture :func:`generate_calls`: what every ``GenerationMixin.generate`` call of a test was given.
"""

from __future__ import annotations

import pytest

from harness import free_port

__all__ = ["free_port", "generate_calls"]


@pytest.fixture
def generate_calls(monkeypatch) -> list[dict]:
    """Every ``GenerationMixin.generate`` call's search settings during the test (its keyword arguments, and
    the fields of a ``generation_config`` passed in); the calls go on to the real ``generate``."""
    from transformers import GenerationMixin

    calls, real = [], GenerationMixin.generate

    def spy(self, *args, **kwargs):
        seen = {k: v for k, v in kwargs.items() if k != "generation_config"}
        if kwargs.get("generation_config") is not None:
            seen.update(kwargs["generation_config"].to_diff_dict())
        calls.append(seen)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "generate", spy)
    return calls
