#!/usr/bin/python3
"""Bytes and time per step of DDP communication hooks: PyTorch's allreduce_hook,
fp16_compress_hook and powerSGD_hook against commpact_hooks' powersgd_hook, topk_hook,
gtopk_hook, efsign_hook and qsgd_hook, on the LeNet-like CNN of examples/libtorch_cnn
(117k parameters), batch 32 per rank, 2 CPU processes over Gloo on loopback, all hooks
in one run, taking turns step by step.

  PYTHONPATH=build/python OMP_NUM_THREADS=1 /usr/bin/python3 bench/torch_hooks/bench_hooks.py [--steps 60]

Bytes: what one rank sends per step. PyTorch's hooks are counted at the hook (the
tensors each allreduce carries; with 2 ranks a ring allreduce sends exactly its input
once), commpact's by its CountingComm (the same ring model for allreduces, exact bytes for
gTop-k's messages). Time: the median wall time of a training step (forward, backward with
the hook, SGD) on rank 0 after the warm-up steps (PowerSGD starts at step 2 in both).
"""
import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as dh
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    from torch.nn.parallel import DistributedDataParallel as DDP
except ImportError as e:
    print("bench_hooks: PyTorch is not importable for this python3 (%s: %s); nothing was run.\n"
          "Install it with: apt-get install python3-torch libopenblas0-openmp\n"
          "and run with Debian's /usr/bin/python3." % (sys.executable, e), file=sys.stderr)
    sys.exit(2)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 16, 5, padding=2)
        self.conv2 = torch.nn.Conv2d(16, 32, 5)
        self.fc1 = torch.nn.Linear(800, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def counted(hook, per_call_bytes):
    """Wraps a PyTorch hook of the default group; its state is the byte counter."""
    counter = [0]

    def wrapper(state, bucket):
        state[0] += per_call_bytes(state, bucket)
        return hook(None, bucket)

    return wrapper, counter


def methods(ch, density):
    def dense_bytes(_, b):
        return b.buffer().numel() * 4

    def fp16_bytes(_, b):
        return b.buffer().numel() * 2

    yield "allreduce_hook (PyTorch)", *counted(dh.allreduce_hook, dense_bytes), None
    yield "fp16_compress_hook (PyTorch)", *counted(dh.fp16_compress_hook, fp16_bytes), None
    for r in (1, 2):
        st = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=r, start_powerSGD_iter=2, random_seed=0)
        # PowerSGDState counts the elements it sends (total_numel_after_compression).
        yield f"powerSGD_hook rank {r} (PyTorch)", psgd.powerSGD_hook, st, "psgd"
        yield f"commpact powersgd_hook rank {r}", ch.powersgd_hook, ch.PowerSGDState(
            matrix_approximation_rank=r, start_powerSGD_iter=2, random_seed=0, name=f"b/psgd{r}"), "commpact"
    yield f"commpact topk_hook density {density}", ch.topk_hook, ch.TopKState(density=density, name="b/topk"), "commpact"
    yield f"commpact gtopk_hook density {density}", ch.gtopk_hook, ch.GTopKState(density=density, name="b/gtopk"), \
        "commpact"
    yield "commpact efsign_hook", ch.efsign_hook, ch.EFSignState(name="b/efsign"), "commpact"
    yield "commpact qsgd_hook 256 levels", ch.qsgd_hook, ch.QSGDState(levels=256, name="b/qsgd"), "commpact"


def bytes_now(state, kind):
    if kind == "psgd":
        return state.total_numel_after_compression * 4
    if kind == "commpact":
        return state.bytes_sent()
    return state[0]


def worker(rank, path, steps, warmup, density, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + path, rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=300))
    import commpact_hooks as ch
    g = torch.Generator().manual_seed(rank)
    data = [(torch.randn(32, 1, 28, 28, generator=g), torch.randint(0, 10, (32,), generator=g))
            for _ in range(8)]
    # Every hook's model exists at once and the methods take turns step by step, so a
    # method's median samples the same stretches of a shared machine as the others'.
    runs = []
    for name, hook, state, kind in methods(ch, density):
        torch.manual_seed(0)
        model = DDP(Net())
        model.register_comm_hook(state, hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        runs.append(dict(name=name, state=state, kind=kind, model=model, opt=opt, times=[], start=0))
    for s in range(warmup + steps):
        x, y = data[s % len(data)]
        for run in runs:
            if s == warmup:
                run["start"] = bytes_now(run["state"], run["kind"])
            dist.barrier()
            t0 = time.perf_counter()
            run["opt"].zero_grad()
            torch.nn.functional.cross_entropy(run["model"](x), y).backward()
            run["opt"].step()
            if s >= warmup:
                run["times"].append(time.perf_counter() - t0)
    rows = [(run["name"], (bytes_now(run["state"], run["kind"]) - run["start"]) / steps,
             statistics.median(run["times"]) * 1e3) for run in runs]
    if rank == 0:
        out.put(rows)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--density", type=float, default=0.01)
    ap.add_argument("--csv", default="")
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    with tempfile.TemporaryDirectory() as tmp:
        ps = [ctx.Process(target=worker, args=(r, os.path.join(tmp, "rdzv"), a.steps, a.warmup, a.density, out))
              for r in range(2)]
        for p in ps:
            p.start()
        for p in ps:
            p.join(timeout=900)
        if any(p.exitcode != 0 for p in ps):
            print("bench_hooks: a rank failed", file=sys.stderr)
            return 1
    rows = out.get()
    base_b, base_t = rows[0][1], rows[0][2]
    print(f"| hook | KB sent per step | vs allreduce | ms per step | vs allreduce |")
    print(f"|---|---:|---:|---:|---:|")
    for name, b, t in rows:
        print(f"| {name} | {b / 1e3:.1f} | {b / base_b:.3f} | {t:.2f} | {t / base_t:.2f} |")
    if a.csv:
        with open(a.csv, "w") as f:
            f.write("hook,bytes_per_step,ms_per_step\n")
            for name, b, t in rows:
                f.write(f"{name},{b:.0f},{t:.3f}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
