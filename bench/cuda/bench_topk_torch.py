"""torch.topk(g.abs(), k) at the sizes of bench_topk.cu (n = 1e6, 1e7, 1e8; density
0.001, 0.01), median of CUDA-event timings; prints "row torch_topk ..." lines for
scripts/device-check. Exits 77 when torch or a CUDA device is missing.

Where it has run, and its results: docs/cuda.md, "Status".
"""
import sys

try:
    import torch
except ImportError:
    print("torch not installed: skipped")
    sys.exit(77)
if not torch.cuda.is_available():
    print("no CUDA device for torch: skipped")
    sys.exit(77)

g = torch.Generator(device="cuda").manual_seed(42)
x = torch.randn(100_000_000, device="cuda", generator=g)
for n in (1_000_000, 10_000_000, 100_000_000):
    for d in (0.001, 0.01):
        k = int(n * d)
        v = x[:n]
        torch.topk(v.abs(), k)
        torch.cuda.synchronize()
        ts = []
        for _ in range(10):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            torch.topk(v.abs(), k)
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b))
        ts.sort()
        print(f"row torch_topk n={n} density={d} torch_ms={ts[len(ts) // 2]:.4f}", flush=True)
