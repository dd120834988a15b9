"""Run a script as if some packages were not installed.

    python -m harness.without apex,deepspeed pretrain_glm.py --flags ...

``glm-migrate --verify`` runs the migrated tree this way, so a pass shows that it needs
neither apex nor DeepSpeed even on a machine that has them: importing a listed package
(or anything under it) raises ModuleNotFoundError, as it would if it were absent.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit("usage: python -m harness.without PKG[,PKG...] SCRIPT [ARGS...]")
    for name in sys.argv[1].split(","):
        sys.modules[name] = None  # the import system's own marker for "cannot be imported"
    script = Path(sys.argv[2]).resolve()
    sys.argv = sys.argv[2:]
    sys.path.insert(0, str(script.parent))  # as `python SCRIPT` would
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
