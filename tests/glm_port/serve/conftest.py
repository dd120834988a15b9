"""A live glm-serve on 127.0.0.1 (uvicorn in a thread, a free port), and the models the tests serve."""

import socket
import sys
import threading
import time

import pytest
import torch
import uvicorn

from glm_port.models import FAMILIES, build_tiny
from glm_port.serve.app import Limits, create_app
from glm_port.serve.engine import Engine, ServedModel

API_KEY = "test-key-0123456789"
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"city": "string"}}}]
SYSTEM = "Tools:"
WEATHER_QUESTION = "Weather in Paris?"
WEATHER_RESULT = "sunny"
WEATHER_ANSWER = "Sunny."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """uvicorn serving ``app`` on 127.0.0.1 in a daemon thread; ``url`` is its ``/v1`` base."""

    def __init__(self, app):
        self.port = free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.05)
        self.root = f"http://127.0.0.1:{self.port}"
        self.url = self.root + "/v1"

    def close(self):
        self.server.should_exit = True
        self.thread.join(timeout=10)


def serve(served, *, api_key=API_KEY, limits=None, **engine_kwargs):
    engine = Engine(served, **engine_kwargs)
    server = LiveServer(create_app(engine, api_key=api_key, limits=limits or Limits(max_tokens=256)))
    server.engine, server.served = engine, served
    return server


def tiny_served(chat_format="chatglm2") -> ServedModel:
    model, tokenizer = build_tiny(chat_format=chat_format)
    return ServedModel(model, tokenizer, FAMILIES["chatglm2"], f"tiny-{chat_format}")


def teach_tool_use(served: ServedModel, steps: int = 200):
    """Train the tiny ChatGLM3-format model, in place, to answer the weather question with a ChatGLM3 tool call
    (``get_weather`` with ``city='Paris'``, then ``<|observation|>``) and, given the tool's result, with
    ``WEATHER_ANSWER`` (then ``<|user|>``), so that a tool round trip has something to parse. The prompts are
    what the server builds from the OpenAI messages (``encode_chat``); the replies are ChatGLM3's layout
    (``build_single_message``), written here."""
    tok, model = served.tokenizer, served.model
    call_args = {"city": "Paris"}
    first = served.encode_chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": WEATHER_QUESTION}],
                               TOOLS)
    call = tok.build_single_message("assistant", "get_weather", "```python\ntool_call(city='Paris')\n```")[1:]
    call += [tok.get_command("<|observation|>")]
    second = served.encode_chat([
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": WEATHER_QUESTION},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": __import__("json").dumps(call_args)}}]},
        {"role": "tool", "content": WEATHER_RESULT}], TOOLS)
    answer = tok.build_single_message("assistant", "", WEATHER_ANSWER)[1:] + [tok.get_command("<|user|>")]
    rows = [(first, call), (second, answer)]
    width = max(len(p) + len(r) for p, r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (prompt, reply) in enumerate(rows):
        sequence = prompt + reply
        ids[i, :len(sequence)] = torch.tensor(sequence)
        labels[i, len(prompt):len(sequence)] = torch.tensor(reply)
    model.train()
    torch.manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step in range(steps):
        loss = model(input_ids=ids, labels=labels, use_cache=False).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if loss.item() < 0.005:
            break
    model.eval()
    return loss.item(), step + 1


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """One intra-op thread: these models are tiny, and on a shared machine two threads wait on each other
    (a training step here measured 20x slower with 2 threads than with 1 under load)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def live(one_thread):
    server = serve(tiny_served(), max_batch=8, max_queue=32)
    yield server
    server.close()
    server.engine.close()


@pytest.fixture(scope="module")
def client(live):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=live.url, api_key=API_KEY, max_retries=0, timeout=60)


def glm_checkpoint(path):
    """A tiny GLM as ``glm-pretrain --save`` writes it (the built-in tokenizer), for GLM's side of glm-serve."""
    from glm_port import GLMConfig, GLMModel
    from glm_port.checkpoint_io import save_checkpoint
    from glm_port.data.tokenization import tiny_wordpiece

    vocab = tiny_wordpiece()
    config = GLMConfig(vocab_size=vocab.vocab_size, num_layers=2, hidden_size=64, num_attention_heads=4,
                       max_sequence_length=32, init_method_std=0.3)
    torch.manual_seed(0)
    save_checkpoint(path, 7, GLMModel(config).state_dict(), config=config)
    return path


@pytest.fixture(scope="session")
def kit():
    """This module's helpers and constants (test modules cannot import a conftest under importlib mode)."""
    return sys.modules[__name__]
