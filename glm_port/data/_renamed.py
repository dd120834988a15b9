"""Old names kept importable after a rename (issue 27: one name, one meaning): a module's ``__getattr__``
that returns the new object under the old name with a ``DeprecationWarning`` naming the new one. (Here, in
glm_port's lowest layer, so every module above may use it.)"""

from __future__ import annotations

import warnings


def renamed(module: str, names: dict[str, str], namespace: dict):
    """``__getattr__`` for ``module``: each old name in ``names`` -> the object ``namespace`` holds under
    its new name."""

    def __getattr__(name: str):
        if name in names:
            warnings.warn(f"{module}.{name} is now {module}.{names[name]}", DeprecationWarning, stacklevel=2)
            return namespace[names[name]]
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__
