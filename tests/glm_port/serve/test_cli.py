"""glm-serve's command line: the two-command start on the embedded model, and bad input as one line, exit 2."""

import os
import subprocess
import sys
import time

import httpx
import pytest

from glm_port.serve import cli


@pytest.mark.parametrize("argv, message", [
    (["--host", "0.0.0.0"], "give --api-key"),
    (["--host", "192.168.1.5", "--api-key", " "], "--api-key is empty"),
    (["--max-batch", "0"], "--max-batch must be at least 1"),
    (["--max-queue", "0"], "--max-queue must be at least 1"),
    (["--port", "70000"], "not a TCP port"),
    (["--top-p", "0"], "--top-p in (0, 1]"),
    (["--model", "/nonexistent/model"], "no such file or directory"),
])
def test_bad_input_is_one_line_exit_2(argv, message, capsys, monkeypatch):
    monkeypatch.delenv("GLM_SERVE_API_KEY", raising=False)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("glm-serve: error: ") and message in err and err.count("\n") == 1


@pytest.mark.parametrize("spelling", ["bf16", "bfloat16"])
def test_dtype_takes_either_spelling_as_every_command_does(spelling):
    """glm-serve's ``--dtype`` is ``glm_port.dtypes``' (bf16 = bfloat16), as glm-generate's and glm-chat's."""
    import torch

    from glm_port.serve.engine import ServedModel

    args = cli.build_parser().parse_args(["--dtype", spelling])
    assert args.dtype == "bf16"
    assert ServedModel.load(None, dtype=spelling).model.dtype == torch.bfloat16


def test_an_unknown_dtype_is_argparses_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["--dtype", "fp8"])
    assert exit_.value.code == 2 and "unknown dtype 'fp8': choose fp32, bf16 or fp16" in capsys.readouterr().err


def test_loopback_names():
    assert cli.is_loopback("127.0.0.1") and cli.is_loopback("::1") and cli.is_loopback("localhost")
    assert not cli.is_loopback("0.0.0.0") and not cli.is_loopback("10.0.0.1")


def test_two_command_start(kit, tmp_path):
    """``glm-serve`` with no arguments (here on a free port, with a key from the environment) serves the
    embedded model; the openai client talks to it."""
    openai = pytest.importorskip("openai")
    port = kit.free_port()
    env = {**os.environ, "GLM_SERVE_API_KEY": "k3y", "OMP_NUM_THREADS": "1"}
    log = open(tmp_path / "server.log", "w")
    process = subprocess.Popen([sys.executable, "-m", "glm_port.serve", "--port", str(port), "--log-level",
                                "warning"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, (tmp_path / "server.log").read_text()
            assert time.monotonic() < deadline, "glm-serve did not come up"
            time.sleep(0.5)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="k3y", max_retries=0)
        name = client.models.list().data[0].id
        reply = client.chat.completions.create(model=name, messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=4)
        assert reply.usage.completion_tokens >= 1
        page = httpx.get(f"http://127.0.0.1:{port}/")
        assert page.status_code == 200 and "<html" in page.text.lower()
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
