"""glm-serve as its users meet it: the official ``openai`` client (and plain HTTP) against a live server on
127.0.0.1. Models are tiny and random (the tool round trip's is taught its two replies first)."""

import json
import threading
import time

import httpx
import pytest
import torch

from glm_port.serve.app import Limits

openai = pytest.importorskip("openai")

HELLO = [{"role": "user", "content": "你好"}]
API_KEY = "test-key-0123456789"  # conftest's


def test_models_lists_the_served_model(client, live):
    models = client.models.list().data
    assert [m.id for m in models] == [live.served.name]


def test_chat_completion_counts_real_tokens(client, live):
    reply = client.chat.completions.create(model=live.served.name, messages=HELLO, max_tokens=12, temperature=0)
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert reply.usage.prompt_tokens == len(live.served.encode_chat(HELLO))
    assert choice.finish_reason in ("stop", "length")
    assert 1 <= reply.usage.completion_tokens <= 12
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens


def test_completion_is_greedy_generate(client, live):
    """A plain completion is the model's own greedy continuation (transformers' generate, same ids)."""
    served, prompt = live.served, "the cat sat on the"
    reply = client.completions.create(model=served.name, prompt=prompt, max_tokens=10, temperature=0)
    ids = served.encode_prompt(prompt)
    padded = served.model.config.padded_vocab_size
    with torch.inference_mode():
        out = served.model.generate(torch.tensor([ids]), max_new_tokens=10, do_sample=False,
                                    eos_token_id=served.model.config.eos_token_id, pad_token_id=0,
                                    suppress_tokens=list(range(served.vocab, padded)))
    new = out[0, len(ids):].tolist()
    new = new[:new.index(2)] if 2 in new else new
    assert reply.choices[0].text == served.decode(new)
    assert reply.usage.prompt_tokens == len(ids)


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_stream_reassembles_to_the_whole_reply(client, live, kind):
    name = live.served.name
    args = dict(model=name, max_tokens=24, temperature=0)
    if kind == "chat":
        whole = client.chat.completions.create(messages=HELLO, **args).choices[0].message.content
        chunks = list(client.chat.completions.create(messages=HELLO, stream=True, **args))
        pieces = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    else:
        whole = client.completions.create(prompt="once upon a time", **args).choices[0].text
        chunks = list(client.completions.create(prompt="once upon a time", stream=True, **args))
        pieces = [c.choices[0].text or "" for c in chunks if c.choices]
    assert len([p for p in pieces if p]) > 1  # it did stream
    assert "".join(pieces) == whole
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_stream_usage_when_asked(client, live):
    chunks = list(client.chat.completions.create(model=live.served.name, messages=HELLO, max_tokens=5,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == 5 or chunks[-2].choices[0].finish_reason == "stop"
    assert chunks[-1].usage.prompt_tokens == len(live.served.encode_chat(HELLO))


def test_seed_n_and_sampling(client, live):
    args = dict(model=live.served.name, messages=HELLO, max_tokens=16, temperature=1.0, top_p=0.95, seed=7, n=3)
    first, again = client.chat.completions.create(**args), client.chat.completions.create(**args)
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in again.choices]  # a seed repeats
    assert len(set(texts)) > 1  # the n choices are different samples
    other = client.chat.completions.create(**{**args, "seed": 8}).choices
    assert [c.message.content for c in other] != texts


def test_penalties_change_greedy_output(client, live):
    args = dict(model=live.served.name, prompt="the the the", max_tokens=30, temperature=0)
    plain = client.completions.create(**args).choices[0].text
    penalised = client.completions.create(**args, frequency_penalty=2.0).choices[0].text
    repeated = client.completions.create(**args, extra_body={"repetition_penalty": 3.0}).choices[0].text
    assert penalised != plain and repeated != plain


def test_stop_strings_cut_the_reply(client, live):
    name = live.served.name
    whole = client.completions.create(model=name, prompt="hello", max_tokens=30, temperature=0).choices[0].text
    words = [w for w in whole.split(" ") if len(w) >= 2]
    assert words, whole
    stop = words[len(words) // 2]
    cut = client.completions.create(model=name, prompt="hello", max_tokens=30, temperature=0, stop=[stop])
    assert cut.choices[0].text == whole[:whole.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model=name, prompt="hello", max_tokens=30, temperature=0, stop=stop,
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == whole[:whole.index(stop)]


def test_concurrent_requests_share_steps_and_match_alone(client, live):
    """Requests in flight together are decoded in one batch (the engine ran steps of several rows) and each
    gets what it gets alone (greedy)."""
    name, prompts = live.served.name, [f"story number {i} begins" for i in range(6)]
    alone = [client.completions.create(model=name, prompt=p, max_tokens=20, temperature=0).choices[0].text
             for p in prompts]
    rows_before = live.engine.max_rows_seen
    together = [None] * len(prompts)

    def ask(i):
        together[i] = client.completions.create(model=name, prompt=prompts[i], max_tokens=20,
                                                temperature=0).choices[0].text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone
    assert live.engine.max_rows_seen >= 2 and live.engine.max_rows_seen >= rows_before


def test_disconnect_stops_the_work(live):
    """A streamed request whose client goes away leaves the batch at the next step."""
    name, engine = live.served.name, live.engine
    body = {"model": name, "prompt": "a long tale", "max_tokens": 250, "temperature": 0, "stream": True,
            "stop": None}
    steps = engine.steps
    with httpx.Client(timeout=30) as http:
        with http.stream("POST", live.url + "/completions", json=body,
                         headers={"Authorization": f"Bearer {API_KEY}"}) as response:
            assert response.status_code == 200
            lines = 0
            for line in response.iter_lines():
                lines += line.startswith("data:")
                if lines >= 3:
                    break
    deadline = time.monotonic() + 20
    while engine.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not engine.running
    ran = engine.steps - steps
    time.sleep(0.3)
    assert engine.steps - steps == ran  # nothing goes on in the background
    assert ran < 200, f"{ran} steps: the request ran on after its client left"


def test_wrong_api_key_is_401(live):
    wrong = openai.OpenAI(base_url=live.url, api_key="not-the-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        wrong.chat.completions.create(model=live.served.name, messages=HELLO, max_tokens=2)
    assert caught.value.status_code == 401
    assert caught.value.body["code"] == "invalid_api_key"
    response = httpx.get(live.url + "/models")  # no key at all
    assert response.status_code == 401 and set(response.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.get(live.root + "/health").status_code == 200  # health and the page need no key


def test_malformed_body_is_400(client, live, kit):
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    response = httpx.post(live.url + "/chat/completions", content=b'{"model": "x", "messages": [', headers=headers)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=live.served.name, messages=[{"role": "wizard", "content": "hi"}])
    with pytest.raises(openai.BadRequestError):  # chatglm2's format has no tools
        client.chat.completions.create(model=live.served.name, messages=HELLO, tools=kit.TOOLS)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=live.served.name, messages=HELLO, temperature=5)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=HELLO)
    assert httpx.get(live.root + "/nowhere").json()["error"]["code"] == "not_found"


def test_caps_are_4xx(kit):
    served = kit.tiny_served()
    server = kit.serve(served, limits=Limits(max_body_bytes=2000, max_prompt_tokens=40, max_tokens=32, max_n=2),
                   max_queue=1)
    try:
        client = openai.OpenAI(base_url=server.url, api_key=API_KEY, max_retries=0)
        name = served.name
        with pytest.raises(openai.BadRequestError) as caught:  # max_tokens over the cap
            client.completions.create(model=name, prompt="hi", max_tokens=33)
        assert caught.value.body["param"] == "max_tokens"
        with pytest.raises(openai.BadRequestError) as caught:  # prompt over the cap
            client.completions.create(model=name, prompt="word " * 60, max_tokens=4)
        assert caught.value.body["code"] == "context_length_exceeded"
        with pytest.raises(openai.APIStatusError) as caught:  # body over the cap
            client.completions.create(model=name, prompt="x" * 3000, max_tokens=4)
        assert caught.value.status_code == 413
        chunked = httpx.post(server.url + "/completions", headers={"Authorization": f"Bearer {API_KEY}"},
                             content=iter([b'{"model": "' + name.encode() + b'", "prompt": "', b"y" * 2500, b'"}']))
        assert chunked.status_code == 413
        with pytest.raises(openai.RateLimitError):  # two sequences for a queue of one
            client.completions.create(model=name, prompt="hi", max_tokens=4, n=2)
        with pytest.raises(openai.BadRequestError):  # n over the cap
            client.completions.create(model=name, prompt="hi", max_tokens=4, n=3)
        assert client.completions.create(model=name, prompt="hi", max_tokens=4).usage.completion_tokens >= 1
    finally:
        server.close()
        server.engine.close()


def test_tool_call_round_trip_chatglm3(kit):
    """ChatGLM3's chat format: the reply's tool call comes back as OpenAI ``tool_calls`` (the arguments as JSON),
    and the tool's result, sent back as a ``tool`` message, is read as ChatGLM3's observation."""
    served = kit.tiny_served("chatglm3")
    loss, _ = kit.teach_tool_use(served)
    assert loss < 0.05
    server = kit.serve(served)
    try:
        client = openai.OpenAI(base_url=server.url, api_key=API_KEY, max_retries=0)
        messages = [{"role": "system", "content": kit.SYSTEM}, {"role": "user", "content": kit.WEATHER_QUESTION}]
        first = client.chat.completions.create(model=served.name, messages=messages, tools=kit.TOOLS, temperature=0,
                                               max_tokens=64)
        choice = first.choices[0]
        assert choice.finish_reason == "tool_calls"
        call = choice.message.tool_calls[0]
        assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris"}
        messages += [choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": kit.WEATHER_RESULT}]
        second = client.chat.completions.create(model=served.name, messages=messages, tools=kit.TOOLS, temperature=0,
                                                max_tokens=64)
        assert second.choices[0].message.content == kit.WEATHER_ANSWER
        assert second.choices[0].finish_reason == "stop" and not second.choices[0].message.tool_calls
        streamed = list(client.chat.completions.create(model=served.name, messages=messages[:2], tools=kit.TOOLS,
                                                       temperature=0, max_tokens=64, stream=True))
        calls = [c.choices[0].delta.tool_calls for c in streamed if c.choices and c.choices[0].delta.tool_calls]
        assert calls and calls[0][0].function.name == "get_weather"
        assert not "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    finally:
        server.close()
        server.engine.close()


def test_glm_completion_fills_blanks(tmp_path, kit):
    """A GLM model (any family through the registry): a prompt with [MASK] comes back filled, as glm-generate
    fills it."""
    from glm_port.generation import cli as generate_cli
    path = kit.glm_checkpoint(tmp_path)
    from glm_port.serve.engine import ServedModel

    served = ServedModel.load(path)
    server = kit.serve(served)
    try:
        client = openai.OpenAI(base_url=server.url, api_key=API_KEY, max_retries=0)
        prompt = "the cat sat on the [MASK] ."
        reply = client.completions.create(model=served.name, prompt=prompt, max_tokens=6, temperature=0)
        args = generate_cli.build_parser().parse_args(["--model", str(path), "--max-new-tokens", "6", "--json",
                                                       "--no-pack", prompt])
        import io

        expected = generate_cli.run(args, out=io.StringIO(), err=io.StringIO())[0]
        assert reply.choices[0].text == expected["text"] and "[MASK]" not in reply.choices[0].text
        assert reply.usage.completion_tokens == sum(len(s) for s in expected["generated_ids"])
        with pytest.raises(openai.BadRequestError):  # GLM has no chat format
            client.chat.completions.create(model=served.name, messages=HELLO)
    finally:
        server.close()
        server.engine.close()


def test_what_is_not_done_is_refused_by_name(client, live):
    name = live.served.name
    for extra in ({"logprobs": True}, {"response_format": {"type": "json_object"}}, {"tool_choice": "required"}):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model=name, messages=HELLO, max_tokens=2, **extra)
        assert caught.value.body["param"] == next(iter(extra))
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=name, prompt="hi", max_tokens=2, echo=True)
    assert client.chat.completions.create(model=name, messages=HELLO, max_tokens=2,
                                          response_format={"type": "text"}).choices


def test_disconnect_stops_a_non_streamed_request(live):
    """A non-streamed request whose client leaves (here: gives up after 0.2 s) stops at the next step; the
    request (8 sampled choices of 256 tokens, the cap of this server) would run longer."""
    engine = live.engine
    body = {"model": live.served.name, "prompt": "a long tale", "max_tokens": 256, "n": 8, "temperature": 1.0,
            "seed": 1}
    steps = engine.steps
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(live.url + "/completions", json=body, headers={"Authorization": f"Bearer {API_KEY}"},
                   timeout=httpx.Timeout(10, read=0.2))
    if not engine.running and engine.steps - steps >= 250:
        pytest.skip("this machine ran the whole request in 0.2 s: no disconnect to observe")
    deadline = time.monotonic() + 20
    while engine.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not engine.running
    assert engine.steps - steps < 250, "the request ran to its end after its client left"
