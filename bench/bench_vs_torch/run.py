#!/usr/bin/python3
"""commpact's host kernels side by side with what a PyTorch user would call instead.

Run from anywhere with Debian's python3 (it installs nothing):

    /usr/bin/python3 bench/bench_vs_torch/run.py [--rounds 3] [--reps 5] [--quick]

It builds driver.cpp with g++ at -O2 and -O3 (CXX overrides the compiler), then, in
each of --rounds interleaved rounds, runs every case once per build and once in
PyTorch, one thread each (torch.set_num_threads(1)). Each run times --reps repetitions
after one warm-up and keeps the median; the table shows the median over rounds of
those medians, in CPU milliseconds of the whole process (steady under the load of
other jobs; wall-clock medians are printed below the table), and the ratios
commpact / PyTorch.

Cases:
  topk      commpact::host::topk_abs(g, k) vs torch.topk(g.abs(), k)
  power     one PowerSGD step at P = 1 on ResNet-18's shapes (error feedback, P = M Q,
            orthonormalise, Q = M^T P, approximation and residual; kernels/host/lowrank.hpp)
            vs torch's own powerSGD_hook (imported, not copied) on a one-rank Gloo
            process group with DDP's default buckets; the hook's time is the sum over
            buckets of the hook call plus the wait for its future.
  scale     Dense at P = 1: finiteness check and scale by 1 / P in one pass
            (host::scale_checked) vs g.div_(1) in place.
  *_class   the same three cases through the library's classes (PowerCompressor,
            Dense, gTopK at P = 1), as a user calls them
  gtopk     gTopK's local phase (ef_accumulate, topk_abs, scatter_into_zeroed,
            zero_delivered) vs the memory floor: 4 streaming read passes over n floats.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

try:
    import torch
except ImportError:
    print("bench_vs_torch: PyTorch is not installed for this python3 (%s); nothing was run.\n"
          "Install it with: apt-get install python3-torch libopenblas0-openmp\n"
          "and run with Debian's /usr/bin/python3." % sys.executable)
    sys.exit(0)


def build(tmp):
    cxx = os.environ.get("CXX", "g++")
    out = {}
    for opt in ("-O2", "-O3"):
        exe = os.path.join(tmp, "driver" + opt)
        cmd = [cxx, "-std=c++20", opt, "-DNDEBUG", "-I", os.path.join(ROOT, "include"),
               os.path.join(HERE, "driver.cpp"), "-o", exe, "-pthread"]
        subprocess.run(cmd, check=True)
        out[opt] = exe
    return out


def driver(exe, args, reps):
    """Runs the C++ driver; returns (cpu_ms, wall_ms) medians."""
    r = subprocess.run([exe] + [str(a) for a in args] + [str(reps)], check=True, capture_output=True, text=True)
    name, wall, cpu = r.stdout.split()[:3]
    return float(cpu), float(wall)


def timed(fn, reps):
    """Warm-up, then reps timings of fn(); returns (cpu_ms, wall_ms) medians."""
    fn()
    cpu, wall = [], []
    for _ in range(reps):
        c0, w0 = time.process_time(), time.perf_counter()
        fn()
        cpu.append((time.process_time() - c0) * 1e3)
        wall.append((time.perf_counter() - w0) * 1e3)
    return statistics.median(cpu), statistics.median(wall)


# ResNet-18's parameter shapes in module order (as torchvision builds them).
def resnet18_shapes():
    s = []

    def conv(out, inp, k):
        s.extend([(out, inp, k, k), (out,), (out,)])  # conv weight, BN weight, BN bias

    conv(64, 3, 7)
    inp = 64
    for width in (64, 128, 256, 512):
        for block in range(2):
            conv(width, inp if block == 0 else width, 3)
            conv(width, width, 3)
            if block == 0 and width != inp:
                conv(width, inp, 1)
        inp = width
    s.extend([(1000, 512), (1000,)])
    return s


class PowerHarness:
    """DDP on a one-rank Gloo group, with powerSGD_hook wrapped to time each bucket."""

    def __init__(self, tmp):
        import torch.distributed as dist
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.psgd = psgd
        if not dist.is_initialized():
            store = dist.FileStore(os.path.join(tmp, "store"), 1)
            dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        gen = torch.Generator().manual_seed(0)
        shapes = resnet18_shapes()

        class Shapes(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.ps = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(*sh, generator=gen)) for sh in shapes])
                self.ws = [torch.randn(*sh, generator=gen) for sh in shapes]

            def forward(self):  # gradient of p = w: fixed Gaussian gradients
                return sum((p * w).sum() for p, w in zip(self.ps, self.ws))

        self.numel = sum(p.numel() for p in Shapes().parameters())
        self.DDP = DDP
        self.Shapes = Shapes

    def make(self, r):
        model = self.DDP(self.Shapes())  # DDP's default bucket sizes (25 MB, first 1 MB)
        state = self.psgd.PowerSGDState(process_group=None, matrix_approximation_rank=r, start_powerSGD_iter=2,
                                        min_compression_rate=2, use_error_feedback=True, warm_start=True)
        acc = {"cpu": 0.0, "wall": 0.0}

        def hook(st, bucket):
            c0, w0 = time.process_time(), time.perf_counter()
            fut = self.psgd.powerSGD_hook(st, bucket)
            fut.wait()
            acc["cpu"] += time.process_time() - c0
            acc["wall"] += time.perf_counter() - w0
            return fut

        model.register_comm_hook(state, hook)
        for _ in range(3):  # iterations 0, 1 are plain allreduce; from 2 on PowerSGD, warm Q
            model().backward()
        return model, acc

    def time(self, r, reps):
        model, acc = self.make(r)
        cpu, wall = [], []
        for _ in range(reps):
            acc["cpu"] = acc["wall"] = 0.0
            model().backward()
            cpu.append(acc["cpu"] * 1e3)
            wall.append(acc["wall"] * 1e3)
        return statistics.median(cpu), statistics.median(wall)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke test)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    tmp = tempfile.mkdtemp(prefix="commpact_vs_torch_")
    try:
        exes = build(tmp)
        harness = PowerHarness(tmp)
        q = 10 if a.quick else 1
        n_dense = harness.numel // q
        n_g = (1 << 24) // q
        rows = []  # (label, driver args, torch case, torch label)
        for n, k in ((int(1e7) // q, int(1e4) // q), (int(2.5e7) // q, int(2.5e5) // q)):
            rows.append(("top-k by magnitude, n = %.3g, k = %.3g" % (n, k), ["topk", n, k], ("topk", n, k),
                         "torch.topk(g.abs(), k)"))
        for r in (1, 2, 4):
            rows.append(("PowerSGD step, ResNet-18 (%d floats), r = %d" % (harness.numel, r), ["power", r],
                         ("power", r), "powerSGD_hook on DDP buckets"))
            rows.append(("  the same through PowerCompressor (+ copy of g), r = %d" % r, ["power_class", r],
                         ("power", r), "powerSGD_hook on DDP buckets"))
        rows.append(("Dense at P = 1 (check + scale), n = %d" % n_dense, ["scale", n_dense], ("scale", n_dense),
                     "g.div_(1)"))
        rows.append(("  the same through Dense<ThreadComm>::reduce", ["dense_class", n_dense], ("scale", n_dense),
                     "g.div_(1)"))
        rows.append(("gTopK local phase, n = %d, k = %d" % (n_g, n_g // 1000), ["gtopk", n_g, n_g // 1000],
                     ("floor", n_g), "memory floor: 4 read passes"))
        rows.append(("  the same through gTopK::reduce at P = 1", ["gtopk_class", n_g, n_g // 1000],
                     ("floor", n_g), "memory floor: 4 read passes"))

        tensors = {}

        def torch_case(spec):
            kind = spec[0]
            if kind == "topk":
                n, k = spec[1], spec[2]
                g = tensors.setdefault(("g", n), torch.randn(n))
                return timed(lambda: torch.topk(g.abs(), k), a.reps)
            if kind == "power":
                return harness.time(spec[1], a.reps)
            if kind == "scale":
                g = tensors.setdefault(("g", spec[1]), torch.randn(spec[1]))
                return timed(lambda: g.div_(1), a.reps)
            if kind == "floor":  # 4 x one read pass, measured by the -O2 driver
                cpu, wall = driver(exes["-O2"], ["floor", spec[1]], a.reps)
                return 4 * cpu, 4 * wall
            raise ValueError(kind)

        results = {i: {"-O2": [], "-O3": [], "torch": []} for i in range(len(rows))}
        for rnd in range(a.rounds):
            for i, (label, args, spec, _) in enumerate(rows):
                for opt in ("-O2", "-O3"):
                    results[i][opt].append(driver(exes[opt], args, a.reps))
                results[i]["torch"].append(torch_case(spec))
            print("round %d of %d done" % (rnd + 1, a.rounds), file=sys.stderr)

        def med(xs, j):
            return statistics.median(x[j] for x in xs)

        print("\nCPU ms (median over %d rounds of the median of %d reps), one thread; torch %s, %s"
              % (a.rounds, a.reps, torch.__version__, os.environ.get("CXX", "g++")))
        print("| case | commpact -O2 | commpact -O3 | PyTorch / floor | ratio -O2 | ratio -O3 |")
        print("|---|---|---|---|---|---|")
        for i, (label, _, _, tl) in enumerate(rows):
            c2, c3, t = med(results[i]["-O2"], 0), med(results[i]["-O3"], 0), med(results[i]["torch"], 0)
            print("| %s | %.2f | %.2f | %s %.2f | %.3f | %.3f |" % (label, c2, c3, tl, t, c2 / t, c3 / t))
        print("\nwall ms medians (same runs): " + "; ".join(
            "%s: %.1f / %.1f / %.1f" % (rows[i][1][0], med(results[i]["-O2"], 1), med(results[i]["-O3"], 1),
                                       med(results[i]["torch"], 1)) for i in range(len(rows))))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
