"""glm-mock: run unmodified GLM-era code on shim by redirecting imports at run time.

One concern per module:

- ``plan``: what is redirected, read from the rule tables in ``rules/`` (the same
  tables the codemod uses), plus ``deepspeed.init_distributed`` from ``shim.deepspeed``;
- ``finder``: the import finder serving stand-in modules, and the hook that applies
  ``shim.compat`` to torch when it is imported on a machine without CUDA;
- ``environ``: the environment that turns the mock on and off, as shell code;
- ``site/sitecustomize.py``: the start-up hook every Python process under the mock runs;
- ``cli``: the ``glm-mock`` command; ``selfcheck``: the run against a THUDM/GLM checkout.
"""
