"""Helpers the test directories share; a test module imports them with ``from ..conftest import NAME``
(files that also run as scripts, as ``tests/distributed/conftest.py`` does, import from the package named).

- :func:`free_port`: a free TCP port on 127.0.0.1 for MASTER_PORT / ``torchrun --master_port``; the
  one implementation is ``harness.free_port``, which the harness and the benches use too.
- Whether a tensor is a DTensor, and its local piece: ``shim.is_global`` and ``shim.to_local``.
"""

from __future__ import annotations

from harness import free_port

__all__ = ["free_port"]
