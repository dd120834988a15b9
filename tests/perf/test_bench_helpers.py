"""bench.peak_memory wraps a script unmodified, and bench.pretrain can read what it prints."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_pretrain_bench():
    import bench.pretrain

    return bench.pretrain


def run_module(*args: str, check: bool = False) -> subprocess.CompletedProcess:
    """``python -m ARGS`` from the repository root, as the benches are run."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=check)


def test_peak_memory_runs_the_script_as_main_and_reports(tmp_path):
    script = tmp_path / "grow.py"
    script.write_text("import sys\nblock = bytearray(64 << 20)\nprint('args', sys.argv[1:], __name__)\n")
    out = run_module("bench.peak_memory", str(script), "--flag", "1", check=True).stdout
    assert "args ['--flag', '1'] __main__" in out
    rss, cuda = load_pretrain_bench().PEAK.findall(out)[-1]
    assert float(rss) >= 64 and cuda == "-"


def test_peak_memory_refuses_a_missing_script(tmp_path):
    proc = run_module("bench.peak_memory", str(tmp_path / "absent.py"))
    assert proc.returncode != 0 and "no such file" in proc.stderr


def test_glm_large_flops_per_token_is_about_2_2_gflop():
    large = load_pretrain_bench().SHAPES["large"]
    assert large.flops_per_token() == pytest.approx(2.15e9, rel=0.01)


@pytest.mark.parametrize("precision", ["fp32", "half"])
def test_glm_port_command_of_the_gpu_case_parses_in_glm_pretrain(precision, tmp_path):
    """The GLM-Large command the bench hands glm-pretrain is one its parser takes, extra flags included."""
    from glm_port.arguments import parse_args

    bench_module = load_pretrain_bench()
    corpus, vocab = tmp_path / "corpus.json", tmp_path / "vocab.txt"
    for path in (corpus, vocab):
        path.write_text("")  # the parsers check that they exist; nothing reads them here
    bench = object.__new__(bench_module.Bench)  # no corpus written: only the command is built
    bench.args = bench_module.parse_args(
        ["--vocab", str(vocab), "--glm-port-flags", "--checkpoint-activations --checkpoint-num-layers 2"])
    bench.corpus, bench.vocab = corpus, vocab
    case = bench_module.Case(bench_module.SHAPES["large"], 16, precision)
    cmd, _, _ = bench.command("glm_port", case)
    flags = cmd[cmd.index("glm_port.pretrain_glm") + 1:]
    args = parse_args(flags)
    assert (args.num_layers, args.hidden_size, args.num_attention_heads, args.seq_length, args.batch_size) == (
        24, 1024, 16, 512, 16)
    assert args.checkpoint_activations and args.checkpoint_num_layers == 2
    assert args.bf16 == (precision == "half")


def test_fp16_iterations_whose_loss_scale_fell_are_left_out():
    bench = load_pretrain_bench()
    log = "\n".join(
        f" iteration {i}/ 6 | elapsed time per iteration (ms): {ms} | lm loss 1.0 | loss scale {scale} |"
        for i, (ms, scale) in enumerate([(90, 2.0**32), (91, 2.0**31), (92, 2.0**30), (100, 2.0**30),
                                         (70, 2.0**29), (102, 2.0**29)], start=1)
    )
    times, skipped = bench.iteration_times("setup line\n" + log + "\npeak memory (MiB): rss 1 | cuda -")
    assert times == [90, 91, 92, 100, 70, 102]
    assert skipped == [False, True, True, False, True, False]
    run = bench.Run(0, times, [], 1.0, Path("log"), skipped)
    assert run.skipped_after(2) == 2 and run.median_ms(2) == 101  # 92 and 70 skipped their step
    no_scale = bench.iteration_times(" iteration 1/ 1 | elapsed time per iteration (ms): 5.0 | lm loss 1.0 |")
    assert no_scale == ([5.0], [False])


BENCHES = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if not p.stem.startswith("_"))


@pytest.mark.parametrize("name", BENCHES)
def test_every_bench_is_a_module_of_the_bench_package(name):
    """Each bench imports as ``bench.NAME`` (no sys.path edits) and its docstring shows ``python -m bench.NAME``."""
    import importlib

    module = importlib.import_module(f"bench.{name}")
    assert callable(module.main)
    assert f"python -m bench.{name}" in module.__doc__
    tree = ast.parse((ROOT / "bench" / f"{name}.py").read_text())
    top = [node for node in tree.body if not isinstance(node, (ast.FunctionDef, ast.ClassDef))]
    edits = [call for node in top for call in ast.walk(node)
             if isinstance(call, ast.Call) and ast.unparse(call.func).startswith("sys.path.")]
    assert not edits, f"bench/{name}.py edits sys.path at module level"


def test_chatglm2_bench_rounds_keep_medians_the_spread_and_whether_tokens_held():
    from bench.chatglm2 import summarize

    def result(rate, ttft, tokens=(5, 6)):
        return {"decode_tok_s": rate, "ttft_ms": ttft, "peak_mib": 10.0, "tokens": list(tokens)}

    rows = summarize({("packed", 1): [result(6.0, 300), result(9.0, 100), result(7.0, 200)],
                      ("thudm", 1): [result(4.0, 1, (5, 6)), result(4.0, 1, (5, 7))],
                      ("chatglm_cpp_f32", 8): []})
    packed, thudm, cpp = rows
    assert (packed["decode_tok_s"], packed["decode_min"], packed["decode_max"], packed["ttft_ms"]) == (7.0, 6.0, 9.0, 200)
    assert packed["stable_tokens"] and not thudm["stable_tokens"] and thudm["tokens"] == [5, 6]
    assert cpp == {"variant": "chatglm_cpp_f32", "batch": 8, "na": True}


def test_peak_memory_reports_where_bench_is_not_importable(tmp_path):
    """bench.pretrain runs the original as ``python bench/peak_memory.py pretrain_glm.py`` inside upstream's
    tree, under glm-mock, with the checkout not on PYTHONPATH: the peak line must come all the same (it was
    missing there, so the original's peak RSS read nan and every memory ratio nanx)."""
    script = tmp_path / "grow.py"
    script.write_text("block = bytearray(96 << 20)\nprint('ran')\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "peak_memory.py"), str(script)], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    rss, cuda = load_pretrain_bench().PEAK.findall(proc.stdout)[-1]
    assert 96 <= float(rss) < 4096 and cuda == "-"


def test_a_run_without_a_peak_line_shows_no_nan_in_the_table():
    from types import SimpleNamespace

    bench = load_pretrain_bench()
    case = bench.Case(bench.SHAPES["tiny"], 4, "fp32")
    runs = {"original": bench.Run(0, [10.0, 10.0], [2.0, 1.0], float("nan"), Path("a.log")),
            "glm_port": bench.Run(0, [5.0, 5.0], [2.0, 1.0], 300.0, Path("c.log"))}
    results = {name: bench.Measured([run]) for name, run in runs.items()}
    table = bench.report(case, results, SimpleNamespace(warmup=0, peak_tflops=1.0), cuda=False)
    assert "nan" not in table
    original, port = table.splitlines()[2:4]
    assert original.split("|")[5].strip() == "-" and port.split("|")[5].strip() == "300"
    assert port.split("|")[6:8] == [" 2.00x ", " - "]  # speed against (a); memory unknown there


XEON = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 85
model name\t: Intel(R) Xeon(R) CPU @ 2.20GHz
flags\t\t: fpu sse2 avx avx2 fma avx512f avx512dq avx512bw avx512vl avx512_vnni

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) CPU @ 2.20GHz
flags\t\t: fpu sse2 avx avx2 avx512f avx512_bf16 amx_tile amx_bf16
"""


def test_cpu_line_names_the_cpu_and_the_flags_figures_depend_on():
    from bench._measure import cpu_line

    line = cpu_line(XEON, usable=2)
    assert line.startswith("CPU: Intel(R) Xeon(R) CPU @ 2.20GHz (GenuineIntel, family 6, model 85), 2 usable CPU(s)")
    # the first processor's flags: AVX-512 without BF16 or AMX (the machine that measured 0.96x, issue 26)
    assert "; has avx2 avx512f avx512_vnni; lacks avx512_bf16 amx_tile amx_bf16" in line
    assert cpu_line("", usable=1).startswith("CPU: ")  # no /proc/cpuinfo: platform's name, no flags claimed
    assert "lacks" not in cpu_line("", usable=1)
    here = cpu_line()
    if Path("/proc/cpuinfo").is_file():
        assert "has " in here and "lacks " in here


@pytest.mark.parametrize("name", [n for n in BENCHES if n != "peak_memory"])  # peak_memory wraps, measures nothing
def test_every_bench_prints_the_cpu_in_its_header(name):
    tree = ast.parse((ROOT / "bench" / f"{name}.py").read_text())
    main = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "main")
    calls = [node for node in ast.walk(main) if isinstance(node, ast.Call) and ast.unparse(node.func) == "print_cpu_line"]
    assert calls, f"bench/{name}.py's main does not print the CPU line (bench._measure.print_cpu_line)"


def test_quantized_bench_table_compares_with_bf16_and_cpp_at_the_same_bits(capsys):
    from bench.quantized import print_table

    def row(variant, batch, rate, tokens):
        return {"variant": variant, "batch": batch, "load_s": 1.0, "file_mib": 10.0, "load_rss_mib": 5.0,
                "ttft_ms": 100.0, "decode_tok_s": rate, "tokens": tokens}

    print_table([row("fp32", 1, 2.0, [1, 2, 3]), row("bf16", 1, 4.0, [1, 2, 3]), row("int4", 1, 12.0, [1, 2, 4]),
                 row("cpp_q4_0", 1, 10.0, [1, 9, 9]), row("bf16", 8, 20.0, [1]), row("int4", 8, 30.0, [1])])
    lines = {tuple(line.split()[:2]): line.split() for line in capsys.readouterr().out.splitlines()[1:]}
    assert lines["int4", "1"][-4:] == ["2/3", "3.00x", "1.20x", "n/a"]  # tokens as fp32's, vs bf16, vs q4_0, load
    assert lines["int4", "8"][-4:] == ["n/a", "1.50x", "n/a", "n/a"]  # no fp32 row at 8; chatglm-cpp does not batch


def test_quantized_bench_rounds_give_each_round_its_own_bf16_ratio(capsys):
    from bench.quantized import print_table, summarize

    def result(variant, rate, load):
        return {"variant": variant, "batch": 1, "load_s": 1.0, "file_mib": 10.0, "load_rss_mib": 5.0,
                "rss_end_mib": 50.0, "ttft_ms": 100.0, "decode_tok_s": rate, "tokens": [1, 2], "load_avg": [load, load]}

    # the machine slows down in round 2: bf16 and int4 both halve, the per-round ratio stays 2.00x, while
    # the ratio of the medians (int4 3.0 / bf16 1.5) would read 2.00x only by luck of the middle values
    samples = {("bf16", 1): [result("bf16", 2.0, 1.0), result("bf16", 1.0, 8.0), result("bf16", 1.6, 4.0)],
               ("int4", 1): [result("int4", 4.0, 1.0), result("int4", 2.0, 8.0), result("int4", 4.8, 4.0)]}
    rows = summarize(samples)
    int4 = next(r for r in rows if r["variant"] == "int4")
    assert int4["bf16_ratios"] == pytest.approx([2.0, 2.0, 3.0]) and int4["decode_tok_s"] == 4.0
    assert (int4["decode_min"], int4["decode_max"], int4["load_avg"]) == (2.0, 4.8, [1.0, 8.0])
    print_table(rows)
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("int4"))
    assert "2.00x (2.00-3.00)" in line and "2.00-4.80" in line and "1.0-8.0" in line
