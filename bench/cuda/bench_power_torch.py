# SPDX-License-Identifier: Apache-2.0
"""PyTorch's own powerSGD_hook (imported, not copied) on CUDA for ResNet-18's 62 tensors,
the shapes of bench/cuda/bench_power.cu (bench/bench_vs_torch/run.py's resnet18_shapes,
which lists the same tensors as bench/resnet18_shapes.hpp), at matrix_approximation_rank
1, 2 and 4, with min_compression_rate 2, error feedback and warm start, as
bench/bench_vs_torch does on the host: DDP with its default buckets on a one-rank
process group (NCCL; Gloo when torch has no NCCL). The gradient of each parameter is a
fixed Gaussian tensor (the model is sum(p * w)). Iterations 0 and 1 are plain allreduce
(start_powerSGD_iter = 2); after 5 more warm-up iterations, each of 30 timed iterations
sums over DDP's buckets the CUDA-event time of the hook call plus the wait for its
future, each measured from an idle device (torch.cuda.synchronize() before it, the
event synchronised after it: the method of bench_power.cu, whose step also starts on an
idle stream and ends with a synchronisation). Prints the median as "row power_torch
rank=R ... torch_ms=..." for scripts/device-check. Exits 77 when torch, its distributed
package or a CUDA device is missing.

Where it has run, and its results: docs/cuda.md, "Status".
"""
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile

try:
    import torch
    import torch.distributed as dist
except ImportError:
    print("torch not installed: skipped")
    sys.exit(77)
if not torch.cuda.is_available():
    print("no CUDA device for torch: skipped")
    sys.exit(77)
if not dist.is_available():
    print("torch built without torch.distributed: skipped")
    sys.exit(77)

from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

WARM, REPS = 5, 30
HERE = os.path.dirname(os.path.abspath(__file__))


def resnet18_shapes():
    """The shape list of bench/bench_vs_torch/run.py (loaded from that file by path)."""
    spec = importlib.util.spec_from_file_location("commpact_bench_vs_torch_run",
                                                  os.path.join(HERE, "..", "bench_vs_torch", "run.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.resnet18_shapes()


def init_group(tmp):
    """A one-rank process group: NCCL when torch has it, else Gloo. Returns the backend."""
    dev = torch.device("cuda", 0)
    for backend in ("nccl", "gloo"):
        if backend == "nccl" and not dist.is_nccl_available():
            continue
        store = dist.FileStore(os.path.join(tmp, "store_" + backend), 1)
        try:
            extra = {"device_id": dev} if backend == "nccl" else {}
            dist.init_process_group(backend, store=store, rank=0, world_size=1, **extra)
            return backend
        except Exception as e:  # a broken NCCL install: say so, try Gloo
            print("process group %s failed (%s); trying the next backend" % (backend, e), flush=True)
    raise RuntimeError("no process group backend works")


def main():
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    shapes = resnet18_shapes()
    tmp = tempfile.mkdtemp(prefix="commpact_power_torch_")
    try:
        backend = init_group(tmp)
        print("torch %s, backend %s, device %s, %d tensors" % (torch.__version__, backend,
                                                                 torch.cuda.get_device_name(0), len(shapes)))

        class Shapes(torch.nn.Module):
            def __init__(self):
                super().__init__()
                gen = torch.Generator(device=dev).manual_seed(0)
                self.ps = torch.nn.ParameterList(
                    [torch.nn.Parameter(torch.randn(*sh, generator=gen, device=dev)) for sh in shapes])
                self.ws = [torch.randn(*sh, generator=gen, device=dev) for sh in shapes]

            def forward(self, scale):  # gradient of p = scale * w: fixed Gaussian gradients
                return scale * sum((p * w).sum() for p, w in zip(self.ps, self.ws))

        for r in (1, 2, 4):
            model = DDP(Shapes(), device_ids=[0])  # DDP's default bucket sizes (25 MB, first 1 MB)
            state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=r, start_powerSGD_iter=2,
                                       min_compression_rate=2, use_error_feedback=True, warm_start=True)
            acc = {"ms": 0.0, "buckets": 0}

            def hook(st, bucket):
                torch.cuda.synchronize()
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                a.record()
                fut = psgd.powerSGD_hook(st, bucket)
                fut.wait()
                b.record()
                b.synchronize()
                acc["ms"] += a.elapsed_time(b)
                acc["buckets"] += 1
                return fut

            model.register_comm_hook(state, hook)
            ts = []
            for it in range(2 + WARM + REPS):  # 0, 1: plain allreduce; from 2 on PowerSGD with a warm Q
                model.zero_grad(set_to_none=False)
                acc["ms"], acc["buckets"] = 0.0, 0
                # DDP's forward needs an input (PyTorch 2.x indexes the moved inputs).
                model(torch.ones((), device=dev)).backward()
                torch.cuda.synchronize()
                if it >= 2 + WARM:
                    ts.append(acc["ms"])
            numel = sum(p.numel() for p in model.parameters())
            print("row power_torch rank=%d tensors=%d numel=%d buckets=%d backend=%s torch_ms=%.4f"
                  % (r, len(shapes), numel, acc["buckets"], backend, statistics.median(ts)), flush=True)
            del model, state
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
