"""One decode step's products, three ways: plain ``F.linear``, MKL-packed (inductor's fp32 freezing path) and
oneDNN-packed (``shim.nn.PackedLinear``), on the weight shapes of one ChatGLM2-6B layer plus its output layer.

    python -m bench.packed_linear                         # fp32 and bf16, 1 and 8 rows
    python -m bench.packed_linear --rows 1 --dtypes float32
    python -m bench.packed_linear --rows 1 --dtypes float32 --per-shape   # + each shape's GB/s, three ways

Per (dtype, rows): the sum over the five shapes of each product's median time (ms), and the GB/s that sum
implies for reading every weight once. MKL packing exists for fp32 only. Why docs/generation.md ("CPU:
packed linear weights") chooses oneDNN's packing, and why it times each shape before packing it.
"""

from __future__ import annotations

import argparse
import time

from bench._measure import print_cpu_line

SHAPES = {  # (out, in) of ChatGLM2-6B's layer products and its output layer
    "query_key_value": (4608, 4096),
    "dense": (4096, 4096),
    "dense_h_to_4h": (27392, 4096),
    "dense_4h_to_h": (4096, 13696),
    "output_layer": (65024, 4096),
}


def median_ms(run, repeats: int) -> float:
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return 1e3 * sorted(times)[len(times) // 2]


def measure(dtype_name: str, rows: int, repeats: int) -> dict:
    import torch
    import torch.nn.functional as F

    dtype = getattr(torch, dtype_name)
    totals = {"plain": 0.0, "mkl": 0.0, "onednn": 0.0}
    shapes = {}  # name -> {way: ms}
    weight_bytes = 0
    with torch.inference_mode():
        for name, (out_features, in_features) in SHAPES.items():
            weight = torch.randn(out_features, in_features).to(dtype)
            x = torch.randn(rows, in_features).to(dtype)
            times = shapes[name] = {"plain": median_ms(lambda: F.linear(x, weight), repeats), "mkl": float("nan")}
            if dtype == torch.float32 and torch._C.has_mkl:
                mkl = torch.ops.mkl._mkl_reorder_linear_weight(weight, rows)
                times["mkl"] = median_ms(lambda: torch.ops.mkl._mkl_linear(x, mkl, weight, None, rows), repeats)
            packed = torch.ops.mkldnn._reorder_linear_weight(weight, rows)
            times["onednn"] = median_ms(
                lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [None], ""), repeats)
            times["bytes"] = weight.numel() * weight.element_size()
            weight_bytes += times["bytes"]
            for way in totals:
                totals[way] += times[way]
            del weight, packed
    return {"totals": totals, "weight_bytes": weight_bytes, "shapes": shapes}


def _cells(times: dict, weight_bytes: int) -> str:
    """``ms (GB/s)`` for the plain, MKL-packed and oneDNN-packed product (n/a where there is none)."""
    cells = [f"{times[way]:8.1f} ({weight_bytes / times[way] / 1e6:4.1f})" if times[way] == times[way] else "n/a"
             for way in ("plain", "mkl", "onednn")]
    return " ".join(f"{c:>17}" for c in cells)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=("float32", "bfloat16"))
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--per-shape", action="store_true", help="also a line per weight shape")
    args = parser.parse_args(argv)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    print_cpu_line()
    print(f"one ChatGLM2-6B layer's products + output layer, {torch.get_num_threads()} threads; ms per step "
          f"(GB/s of weights read)")
    print(f"{'dtype':<9} {'rows':>4} {'plain F.linear':>17} {'MKL-packed':>17} {'oneDNN-packed':>17}")
    for dtype in args.dtypes:
        for rows in args.rows:
            result = measure(dtype, rows, args.repeats)
            print(f"{dtype:<9} {rows:>4} " + _cells(result["totals"], result["weight_bytes"]))
            if args.per_shape:
                for name, times in result["shapes"].items():
                    print(f"  {name:<17} " + _cells(times, times["bytes"]))


if __name__ == "__main__":
    main()
