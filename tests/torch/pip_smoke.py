"""Import-and-train smoke test of an installed commpact_hooks (run by test_pip_install.py
from a temporary folder with the virtual environment's Python, never from the source tree).

Two CPU processes, DDP over Gloo, a small MLP, gtopk_hook at density 0.1: the module
must come from the environment's site-packages, the parameters must be bit-identical on
both ranks after training, and the loss must fall.
Run: <venv>/bin/python pip_smoke.py <site-packages folder>
"""
import datetime
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

WORLD = 2
STEPS = 40


def worker(rank, path, site, out):
    try:
        torch.set_num_threads(1)
        import commpact_hooks
        where = os.path.realpath(commpact_hooks.__file__)
        if not where.startswith(os.path.realpath(site) + os.sep):
            raise AssertionError(f"commpact_hooks was imported from {where}, not from {site}")
        dist.init_process_group("gloo", init_method="file://" + path, rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=60))
        torch.manual_seed(7)
        model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 3)),
                    bucket_cap_mb=0.001)  # several buckets
        state = commpact_hooks.GTopKState(density=0.1, timeout=60.0)
        model.register_comm_hook(state, commpact_hooks.gtopk_hook)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        teacher = torch.randn(16, 3, generator=torch.Generator().manual_seed(3))
        gen = torch.Generator().manual_seed(100 + rank)  # each rank its own data
        losses = []
        for _ in range(STEPS):
            x = torch.randn(16, 16, generator=gen)
            loss = torch.nn.functional.cross_entropy(model(x), (x @ teacher).argmax(1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        parts = [torch.empty_like(flat) for _ in range(WORLD)]
        dist.all_gather(parts, flat)
        if not torch.equal(parts[0], parts[1]):
            raise AssertionError(f"rank {rank}: the replicas differ by {(parts[0] - parts[1]).abs().max().item():.3e}")
        first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
        if not last < 0.8 * first:
            raise AssertionError(f"rank {rank}: the loss did not fall enough ({first:.4f} -> {last:.4f})")
        if state.bytes_sent() <= 0:
            raise AssertionError(f"rank {rank}: the hook sent no bytes")
        dist.destroy_process_group()
        out.put(f"ok {rank} loss {first:.4f} -> {last:.4f}, {state.bytes_sent()} bytes sent")
    except Exception as e:  # reported by the parent
        out.put(f"rank {rank}: {type(e).__name__}: {e}")


def check_version():
    """The module's __version__ (the headers' COMMPACT_VERSION_*) is the installed
    distribution's version (setup.py's)."""
    import importlib.metadata
    import commpact_hooks
    installed = importlib.metadata.version("commpact-hooks")
    if getattr(commpact_hooks, "__version__", None) != installed:
        raise SystemExit(f"pip_smoke: commpact_hooks.__version__ is {getattr(commpact_hooks, '__version__', None)!r}, "
                         f"the installed package's version {installed!r}")
    print(f"commpact_hooks {commpact_hooks.__version__}")


def main():
    site = sys.argv[1]
    check_version()
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.get_context("spawn")
        out = ctx.SimpleQueue()
        procs = [ctx.Process(target=worker, args=(r, os.path.join(tmp, "rdzv"), site, out)) for r in range(WORLD)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
            if p.is_alive():
                p.kill()
        msgs = []
        while not out.empty():
            msgs.append(out.get())
    print("\n".join(msgs))
    ok = [m for m in msgs if m.startswith("ok ")]
    if len(ok) != WORLD or any(p.exitcode != 0 for p in procs):
        print(f"pip_smoke: failed (exit codes {[p.exitcode for p in procs]})", file=sys.stderr)
        return 1
    print("pip_smoke: the installed commpact_hooks trained 2 DDP ranks over Gloo; replicas identical, loss fell")
    return 0


if __name__ == "__main__":
    sys.exit(main())
