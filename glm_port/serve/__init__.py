"""``glm-serve``: OpenAI's HTTP API over any model glm_port loads, with batching, limits and a chat page.

``engine`` (the model as served, the batching scheduler), ``app`` (FastAPI), ``cli`` (the command),
``static/index.html`` (the page). docs/serve.md.
"""
