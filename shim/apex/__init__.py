"""apex's Python-level pieces that have no other home in shim (most apex names map to ``shim.nn`` /
``shim.optim``; see rules/apex.toml): ``shim.apex.multi_tensor_apply``."""
