"""Lazy re-export of shim's own names, so importing shim stays as cheap as importing torch."""

from __future__ import annotations

import importlib


def lazy_names(namespace: dict, own: dict[str, str], fallback):
    """A module ``__getattr__`` serving ``own`` (name -> defining module) first, then ``fallback``."""

    def __getattr__(name: str):
        if name == "__all__":
            return sorted(set(fallback(name)) | set(own))
        module_name = own.get(name)
        if module_name is None:
            return fallback(name)
        value = getattr(importlib.import_module(module_name), name)
        namespace[name] = value
        return value

    return __getattr__
