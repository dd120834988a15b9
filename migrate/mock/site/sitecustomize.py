"""glm-mock's start-up hook. ``glm-mock enable`` puts this directory first on
PYTHONPATH, so every Python process of the shell (torchrun workers and
multiprocessing children included) runs it. It installs the import finder of
``migrate.mock.finder`` unless GLM_MOCK_DISABLE is set, then runs the user's own
``sitecustomize`` (the next one on sys.path), as if this one were not there.
"""

import importlib.machinery
import importlib.util
import os
import sys


def _activate():
    try:
        from migrate.mock import finder
    except ImportError as exc:  # a Python without glm-migrate installed inherited the PYTHONPATH
        sys.stderr.write(f"glm-mock: inactive in {sys.executable}: {exc}\n")
        return
    finder.install(os.environ)


def _chain_user_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    entries = [os.path.abspath(p or os.curdir) for p in sys.path]
    after = entries[entries.index(here) + 1 :] if here in entries else []
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [p for p in after if p != here])
    if spec is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


# The kill switch (migrate.mock.finder.ENV_DISABLE), checked before importing anything.
if os.environ.get("GLM_MOCK_DISABLE", "") in ("", "0"):
    _activate()
_chain_user_sitecustomize()
