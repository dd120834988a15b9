"""The environment that turns glm-mock on and off, and the shell code that sets it.

Enabling puts :data:`SITE_DIR` (which holds the start-up hook) first on
PYTHONPATH, remembering the previous value; child processes inherit it.
Disabling restores PYTHONPATH exactly, including "was unset" versus "was empty".
Changes are computed as ``{name: value, or None to unset}`` so the same logic
serves ``eval "$(glm-mock)"`` and ``glm-mock run``.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from migrate.mock.finder import ENV_FORCE

SITE_DIR = str(Path(__file__).resolve().with_name("site"))
ENV_ACTIVE = "GLM_MOCK_ACTIVE"
ENV_SAVED = "GLM_MOCK_SAVED_PYTHONPATH"  # set only when PYTHONPATH was set (possibly empty)


def _without_site(pythonpath: str) -> str:
    return os.pathsep.join(p for p in pythonpath.split(os.pathsep) if p != SITE_DIR)


def disable_changes(environ) -> dict[str, str | None]:
    """Undo :func:`enable_changes`. PYTHONPATH goes back to the saved value; if the
    user edited it meanwhile, only glm-mock's entry is taken out of it."""
    if ENV_ACTIVE not in environ:
        return {}
    current, saved = environ.get("PYTHONPATH"), environ.get(ENV_SAVED)
    if current == (SITE_DIR if not saved else SITE_DIR + os.pathsep + saved):
        restored = saved
    else:
        restored = _without_site(current or "") or None
    return {"PYTHONPATH": restored, ENV_ACTIVE: None, ENV_SAVED: None, ENV_FORCE: None}


def enable_changes(environ, force: str = "") -> dict[str, str | None]:
    """PYTHONPATH with the hook directory first; ``force``: scopes whose stand-in wins."""
    changes = disable_changes(environ)
    base = {**environ, **changes}
    previous = base.get("PYTHONPATH")
    changes.update(
        {
            "PYTHONPATH": SITE_DIR if not previous else SITE_DIR + os.pathsep + previous,
            ENV_SAVED: previous,
            ENV_ACTIVE: "1",
            ENV_FORCE: force or None,
        }
    )
    return changes


def apply(environ, changes: dict[str, str | None]) -> dict[str, str]:
    env = dict(environ)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


def shell_code(changes: dict[str, str | None], shell: str = "sh") -> str:
    """``changes`` as code for ``eval``: POSIX sh (bash, zsh, dash) or fish."""
    lines = []
    for name, value in changes.items():
        if shell == "fish":
            lines.append(f"set -e {name};" if value is None else f"set -gx {name} {shlex.quote(value)};")
        else:
            lines.append(f"unset {name};" if value is None else f"export {name}={shlex.quote(value)};")
    return "\n".join(lines)
