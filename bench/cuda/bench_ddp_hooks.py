# SPDX-License-Identifier: Apache-2.0
"""commpact_hooks on a GPU under DDP, for scripts/device-check (which runs bench/cuda/*.py
when torch sees a CUDA device; this one under HOOKS_TIMEOUT, 300 s by default):

 0. builds the module's CUDA variant with pip against this machine's PyTorch, with the
    Python that runs this script: `pip install --no-build-isolation --no-index --target
    <temporary folder> <repository>` (COMMPACT_HOOKS_CUDA=1, the GPU's architecture, all
    cores), then runs the checks below again with that folder first on PYTHONPATH;
 1. DDP with one process on NCCL, the LeNet-like CNN of examples/libtorch_cnn on
    synthetic data, each hook in a process of its own (a crash ends only that hook's
    check, prints the Python stack (faulthandler) and the native frames
    (COMMPACT_HOOKS_BACKTRACE=1), and the other hooks go on): every commpact hook (gTop-k and Top-k at density 0.01, PowerSGD
    rank 1 and 2, EF-SignSGD, QSGD) against the same hook on the CPU over a Gloo group
    (same start, same batches): parameters within float tolerance after a few steps;
    commpact's powersgd_hook against PyTorch's powerSGD_hook at the same rank and seed
    (within float tolerance); on the GPU, gtopk_hook's error path: a bucket on another
    stream than the first raises a RuntimeError naming the rule;
 2. two processes sharing the GPU over Gloo with CUDA buckets (staged): gtopk_hook and
    powersgd_hook keep the replicas identical, the loss falls, and the bytes sent equal
    those of the same hook on CPU buckets (the parameters' distance to that run printed);
 3. time per step (forward, backward with the hook, SGD; median of the timed steps, the
    hooks taking turns step by step) of each hook against PyTorch's allreduce_hook, and
    of powersgd_hook against powerSGD_hook at the same rank: "row ddp_hooks ..." lines.

Time: the parts share one budget, BUDGET_S seconds (device-check passes its cap for this
script less 10 s; without BUDGET_S, BENCH_TIMEOUT or 180, less 15 s); a part that would
start with under 20 s left is skipped ("SKIPPED" in device-check's run.log) and the script then exits 3 (device-check's
summary: "FAILED (3)"), so the run ends with its results before device-check's cap
kills it.

--device cpu runs 1 to 3 on the CPU over Gloo (no pip install: PYTHONPATH must reach the
module), to check this script on a machine without a GPU:
  PYTHONPATH=build/python OMP_NUM_THREADS=1 python3 bench/cuda/bench_ddp_hooks.py --device cpu --installed
Exits 77 when torch or a CUDA device is missing, 1 when a check fails.

Where it has run, and its results: docs/cuda.md, "Status".
"""
import argparse
import datetime
import faulthandler
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback

faulthandler.enable()  # a crash in the extension prints the Python stack that reached it
HERE = os.path.dirname(os.path.abspath(__file__))
# The end of the budget (epoch seconds), shared with the re-run after the pip install.
DEADLINE = float(os.environ.get("COMMPACT_HOOKS_DEADLINE") or
                 time.time() + float(os.environ.get("BUDGET_S") or float(os.environ.get("BENCH_TIMEOUT", 180)) - 15))
os.environ["COMMPACT_HOOKS_DEADLINE"] = str(DEADLINE)


def time_left():
    return DEADLINE - time.time()
ROOT = os.path.dirname(os.path.dirname(HERE))

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except ImportError:
    print("torch not installed: skipped")
    sys.exit(77)
# fp32 convolutions and products on the GPU, as on the CPU: the checks compare the two within
# 1e-3, and TF32 (PyTorch's default for cuDNN convolutions) could flip a top-k selection.
torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False


class Net(torch.nn.Module):
    """The LeNet-like CNN of examples/libtorch_cnn (117,066 parameters)."""

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


def batches(rank, steps, dev, batch=32):
    """Synthetic images: a fixed random template per class plus noise (learnable in a few steps)."""
    templates = torch.randn(10, 1, 28, 28, generator=torch.Generator().manual_seed(3))
    gr = torch.Generator().manual_seed(100 + rank)
    out = []
    for _ in range(steps):
        y = torch.randint(0, 10, (batch,), generator=gr)
        x = templates[y] + torch.randn(batch, 1, 28, 28, generator=gr)
        out.append((x.to(dev), y.to(dev)))
    return out


def flat(model):
    return torch.cat([p.detach().reshape(-1).cpu() for p in model.parameters()])


def hooks(ch, pg, tag):
    """(name, hook, state) of every commpact hook, over group pg."""
    yield "gtopk", ch.gtopk_hook, ch.GTopKState(pg, density=0.01, name=f"{tag}/gtopk")
    yield "topk", ch.topk_hook, ch.TopKState(pg, density=0.01, name=f"{tag}/topk")
    for r in (1, 2):
        yield f"powersgd{r}", ch.powersgd_hook, ch.PowerSGDState(pg, matrix_approximation_rank=r,
                                                                 start_powerSGD_iter=2, random_seed=0,
                                                                 name=f"{tag}/psgd{r}")
    yield "efsign", ch.efsign_hook, ch.EFSignState(pg, name=f"{tag}/efsign")
    yield "qsgd", ch.qsgd_hook, ch.QSGDState(pg, levels=256, seed=1, name=f"{tag}/qsgd")


def train(dev, data, hook=None, state=None, pg=None, lr=0.05):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(7)
    net = Net().to(dev)
    model = DDP(net, device_ids=[dev] if dev.type == "cuda" else None, process_group=pg, bucket_cap_mb=0.1)
    if hook is not None:
        model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for x, y in data:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if state is not None and hasattr(state, "synchronize"):
        state.synchronize()  # commpact's CUDA hooks: the last step's status (an error raises here)
    return model, losses


def check(cond, what, failures):
    print(("ok      " if cond else "FAILED  ") + what, flush=True)
    if not cond:
        failures.append(what)


HOOK_NAMES = ("gtopk", "topk", "powersgd1", "powersgd2", "efsign", "qsgd")


def one_process_group(gpu, with_gloo):
    """A one-rank default group (NCCL on the GPU, else Gloo) and, with_gloo, a Gloo group
    beside it (else None); returns (a folder to remove, that group)."""
    tmp = tempfile.mkdtemp()
    dist.init_process_group("nccl" if gpu else "gloo", init_method="file://" + os.path.join(tmp, "rdzv"), rank=0,
                            world_size=1, timeout=datetime.timedelta(seconds=60))
    return tmp, dist.new_group(backend="gloo") if with_gloo else None


def one_hook(args):
    """Check 1 for the hook args.hook alone (run in a process of its own: a crash ends only it)."""
    import commpact_hooks as ch
    failures = []
    gpu = args.device == "cuda"
    dev = torch.device("cuda", 0) if gpu else torch.device("cpu")
    tmp, cpu_pg = one_process_group(gpu, True)
    steps = args.check_steps
    data, cdata = batches(0, steps, dev), batches(0, steps, torch.device("cpu"))
    for (name, hook, st), (_, chook, cst) in zip(hooks(ch, None, "dev"), hooks(ch, cpu_pg, "cpu")):
        if name != args.hook:
            continue
        t0 = time.monotonic()
        m, losses = train(dev, data, hook, st)
        c, _ = train(torch.device("cpu"), cdata, chook, cst, pg=cpu_pg)
        err = (flat(m) - flat(c)).abs().max().item()
        check(all(map(lambda v: v == v, losses)), f"{name}: finite losses on {dev.type}", failures)
        check(err <= 1e-3, f"{name}: parameters on {dev.type} within 1e-3 of the CPU's after {steps} steps "
              f"(max |diff| {err:.2e}, {time.monotonic() - t0:.1f} s)", failures)
        if gpu and name == "gtopk":  # the error path of the CUDA side: a clear exception, not a crash
            raised = ""
            try:
                with torch.cuda.stream(torch.cuda.Stream()):
                    x, y = data[0]
                    torch.nn.functional.cross_entropy(m(x), y).backward()
                    st.synchronize()
            except RuntimeError as e:
                raised = str(e)
            check("another stream" in raised, f"{name}: a bucket on another stream than the first raises "
                  f"RuntimeError naming the rule ({raised[:160]!r})", failures)
    dist.destroy_process_group()
    shutil.rmtree(tmp, ignore_errors=True)
    return 1 if failures else 0


def single_process(args, failures):
    """Check 1 (each hook in a process of its own, so that a crash in one hook leaves the
    others' results), then checks 1b and 3 in this process (one rank) for the hooks that passed."""
    import commpact_hooks as ch
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks as dh
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    gpu = args.device == "cuda"
    dev = torch.device("cuda", 0) if gpu else torch.device("cpu")
    if gpu:
        check(ch.has_cuda, "the installed commpact_hooks has the CUDA variant", failures)
    # 1. Each hook on the device against the same hook on the CPU, in a process of its own.
    good = set()
    for name in HOOK_NAMES:
        if time_left() < 20:
            print(f"SKIPPED check 1 of {name} and the rest: {time_left():.0f} s of the budget left", flush=True)
            break
        print(f"run     {name} on {dev.type}", flush=True)
        cmd = [sys.executable, os.path.abspath(__file__), "--installed", "--device", args.device, "--hook", name,
               "--check-steps", str(args.check_steps)]
        env = dict(os.environ, COMMPACT_HOOKS_BACKTRACE="1")  # a crash prints its native frames too
        try:
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               timeout=max(5.0, time_left() - 10))
            out, rc = r.stdout, r.returncode
        except subprocess.TimeoutExpired as e:
            out, rc = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), None
        sys.stdout.write(out)
        if rc is None:
            check(False, f"{name}: check 1 did not end within the budget", failures)
        elif rc < 0:
            check(False, f"{name}: check 1 was killed by signal {-rc} (the output above ends where it died)", failures)
        elif rc != 0:
            failures.append(f"{name}: check 1")  # its own lines above say which check failed
        else:
            good.add(name)
    tmp, _ = one_process_group(gpu, False)
    steps = args.check_steps
    data = batches(0, steps, dev)
    for r in (1, 2):
        if f"powersgd{r}" not in good:
            print(f"SKIPPED powersgd rank {r} against powerSGD_hook: its check 1 failed", flush=True)
            continue
        ref_st = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=r, start_powerSGD_iter=2,
                                    random_seed=0)
        a, _ = train(dev, data, psgd.powerSGD_hook, ref_st)
        b, _ = train(dev, data, ch.powersgd_hook,
                     ch.PowerSGDState(matrix_approximation_rank=r, start_powerSGD_iter=2, random_seed=0,
                                      name=f"ref/psgd{r}"))
        err = (flat(a) - flat(b)).abs().max().item()
        check(err <= 1e-4, f"powersgd rank {r}: commpact within 1e-4 of PyTorch's powerSGD_hook (max |diff| {err:.2e})",
              failures)
    # 1c. ModelAverager on CUDA parameters over the NCCL group alone, which refuses CPU
    # tensors: its round's check runs on the CUDA side's control plane (one rank: the mean
    # is the parameters themselves, exactly).
    if gpu:
        try:
            g = torch.Generator().manual_seed(5)
            params = [torch.randn(s, generator=g).to(dev) for s in ((3, 5), (7,))]
            before = [p.clone() for p in params]
            avg = ch.ModelAverager(period=1, timeout=max(5.0, min(30.0, time_left() - 10)), name="nccl/avg")
            did = avg.step(params, 0.1)
            same = all(torch.equal(p, q) for p, q in zip(params, before))
            check(did and same, "ModelAverager on CUDA parameters over NCCL alone: one round, the parameters "
                  f"unchanged at one rank ({avg.bytes_sent()} bytes sent)", failures)
        except Exception as e:  # a failure is a row, the timings below still run
            check(False, f"ModelAverager on CUDA parameters over NCCL alone raised {str(e)[:200]!r}", failures)
    # 3. Time per step, the hooks taking turns step by step.
    runs = [("allreduce_hook", dh.allreduce_hook, None)]
    for r in (1, 2):
        runs.append((f"powerSGD_hook{r}", psgd.powerSGD_hook,
                     psgd.PowerSGDState(process_group=None, matrix_approximation_rank=r, start_powerSGD_iter=2,
                                        random_seed=0)))
    runs += [(n, h, s) for n, h, s in hooks(ch, None, "time") if n in good]
    from torch.nn.parallel import DistributedDataParallel as DDP
    models = []
    for name, hook, st in runs:
        torch.manual_seed(7)
        model = DDP(Net().to(dev), device_ids=[dev] if gpu else None, bucket_cap_mb=0.1)
        model.register_comm_hook(st, hook)
        models.append((name, model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), []))
    tdata = batches(0, args.warmup + args.time_steps, dev)
    sync = torch.cuda.synchronize if gpu else (lambda: None)
    for i, (x, y) in enumerate(tdata):
        for name, model, opt, times in models:
            sync()
            t0 = time.perf_counter()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            sync()
            if i >= args.warmup:
                times.append((time.perf_counter() - t0) * 1e3)
    med = {name: statistics.median(times) for name, _, _, times in models}
    for name, _, _, _ in models:
        base = f"powerSGD_hook{name[-1]}" if name.startswith("powersgd") else "allreduce_hook"
        print(f"row ddp_hooks device={dev.type} hook={name} ms={med[name]:.3f} vs={base} "
              f"ratio={med[name] / med[base]:.3f}", flush=True)
    dist.destroy_process_group()
    shutil.rmtree(tmp, ignore_errors=True)


def two_ranks(rank, path, dev_type, steps, out):
    """Check 2 on one rank: Gloo, buckets on the device (CUDA: staged)."""
    try:
        import commpact_hooks as ch
        dev = torch.device("cuda", 0) if dev_type == "cuda" else torch.device("cpu")
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method="file://" + path, rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=60))
        res = []
        cpu = torch.device("cpu")
        # a hang in a staged call ends within the budget, with the states' timeout_error
        wait = max(10.0, min(60.0, time_left() - 10))

        def states(tag):
            return (("gtopk", ch.gtopk_hook, ch.GTopKState(density=0.05, timeout=wait, name=f"{tag}/gtopk")),
                    ("powersgd", ch.powersgd_hook, ch.PowerSGDState(matrix_approximation_rank=2,
                                                                    start_powerSGD_iter=2, timeout=wait,
                                                                    name=f"{tag}/psgd")))
        for (name, hook, st), (_, chook, cst) in zip(states("two"), states("two-cpu")):
            m, losses = train(dev, batches(rank, steps, dev), hook, st)
            c, closses = train(cpu, batches(rank, steps, cpu), chook, cst)
            p = flat(m)
            parts = [torch.empty_like(p) for _ in range(2)]
            dist.all_gather(parts, p)
            first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
            res.append((name, torch.equal(parts[0], parts[1]), first, last, st.bytes_sent(), cst.bytes_sent(),
                        (p - flat(c)).abs().max().item(), losses, closses))
        # ModelAverager on the device's parameters: every rank ends with the two ranks' mean.
        g = torch.Generator().manual_seed(40 + rank)
        params = [torch.randn(s, generator=g).to(dev) for s in ((3, 5), (7,), (2, 2, 2))]
        mine = torch.cat([q.reshape(-1).cpu() for q in params])
        both = [torch.empty_like(mine) for _ in range(2)]
        dist.all_gather(both, mine)
        avg = ch.ModelAverager(period=1, timeout=wait, name="two/avg")
        did = avg.step(params, 0.1)
        got = torch.cat([q.reshape(-1).cpu() for q in params])
        res.append(("ModelAverager", did and params[0].device == dev,
                    ((both[0] + both[1]) / 2 - got).abs().max().item(), avg.bytes_sent()))
        dist.destroy_process_group()
        out.put((rank, res))
    except Exception:
        out.put((rank, traceback.format_exc()))


def two_process(args, failures):
    with tempfile.TemporaryDirectory() as tmp:
        ctx = mp.get_context("spawn")
        out = ctx.SimpleQueue()
        procs = [ctx.Process(target=two_ranks, args=(r, os.path.join(tmp, "rdzv"), args.device, args.two_steps, out))
                 for r in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=max(5.0, time_left() - 5))  # the rows printed below need the rest
            if p.is_alive():
                p.kill()
        got = {}
        while not out.empty():
            r, res = out.get()
            got[r] = res
    check(sorted(got) == [0, 1] and all(isinstance(v, list) for v in got.values()),
          f"two processes over Gloo on {args.device} ran: " +
          "; ".join(v if isinstance(v, str) else "ok" for v in got.values()), failures)
    for r, res in got.items():
        if isinstance(res, list) and r == 0:
            for entry in res:
                if entry[0] == "ModelAverager":
                    _, ok, err, b = entry
                    check(ok and err <= 1e-6, f"ModelAverager on {args.device} parameters over Gloo: averaged in "
                          f"place to the two ranks' mean (max |diff| {err:.2e}, {b} bytes sent)", failures)
                    continue
                name, same, first, last, b, cb, err, losses, closses = entry
                # The two runs' loss curves (every 5th step): where a device run parts from the
                # CPU's, and whether the CPU run fell as far.
                print(f"note    {name} losses, {args.device} buckets: " +
                      " ".join(f"{v:.3f}" for v in losses[::5]) + "; CPU buckets: " +
                      " ".join(f"{v:.3f}" for v in closses[::5]), flush=True)
                check(same, f"{name}: replicas identical over Gloo with {args.device} buckets", failures)
                check(b == cb, f"{name}: bytes sent with {args.device} buckets {b} = {cb} with CPU buckets", failures)
                print(f"row ddp_hooks_gloo device={args.device} hook={name} bytes={b} max_diff_vs_cpu={err:.3e}")
                check(last < 0.7 * first, f"{name}: the loss fell over Gloo with {args.device} buckets "
                      f"({first:.3f} -> {last:.3f})", failures)


def describe_module(site):
    """One line on how the module was linked: its libstdc++ (shared, or copies of libstdc++
    symbols defined in the module itself, a static libstdc++) and the interpreter's LDSHARED."""
    import glob
    import sysconfig
    so = (glob.glob(os.path.join(site, "commpact_hooks*.so")) or [None])[0]
    own = "?"
    if so and shutil.which("nm"):
        r = subprocess.run(["nm", "-DC", "--defined-only", so], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                           text=True)
        own = sum(1 for line in r.stdout.splitlines() if "std::locale" in line or "std::ios_base" in line)
    print(f"note    module {os.path.basename(so or '?')}: libstdc++ symbols defined in it (std::locale, "
          f"std::ios_base): {own}; LDSHARED={sysconfig.get_config_var('LDSHARED')!r}", flush=True)


def install(tmp):
    """The CUDA variant into tmp/site; returns that folder, or None when the build failed."""
    site = os.path.join(tmp, "site")
    major, minor = torch.cuda.get_device_capability(0)
    env = dict(os.environ, COMMPACT_HOOKS_CUDA="1", COMMPACT_HOOKS_ARCH=f"{major}.{minor}",
               COMMPACT_HOOKS_BUILD_DIR=os.path.join(tmp, "build"), MAX_JOBS=str(os.cpu_count() or 2),
               PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-build-isolation", "--no-index", "--no-deps",
                        "--target", site, ROOT], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(f"row ddp_hooks_build pip_install_s={time.monotonic() - t0:.1f} rc={r.returncode}", flush=True)
    if r.returncode != 0:
        print(r.stdout[-6000:])
    else:
        describe_module(site)
    return site if r.returncode == 0 else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--installed", action="store_true", help="commpact_hooks is importable: skip the pip install")
    ap.add_argument("--check-steps", type=int, default=3)
    ap.add_argument("--two-steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--time-steps", type=int, default=20)
    ap.add_argument("--hook", choices=HOOK_NAMES, help="(internal) check 1 of this hook alone, then exit")
    args = ap.parse_args()
    if args.hook:
        return one_hook(args)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device for torch: skipped")
        return 77
    if args.device == "cuda" and not args.installed:
        with tempfile.TemporaryDirectory(prefix="commpact-hooks-gpu-") as tmp:
            site = install(tmp)
            if site is None:
                print("FAILED  pip install of the CUDA variant")
                return 1
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [site, os.environ.get("PYTHONPATH")])))
            rc = subprocess.run([sys.executable, os.path.abspath(__file__), "--installed"] + sys.argv[1:],
                                cwd=tmp, env=env).returncode
            if rc < 0:
                print(f"FAILED  the checks with the installed module were killed by signal {-rc}", flush=True)
                return 1
            return rc
    failures, skipped = [], []
    for name, part in (("1 and 3 (one process)", single_process), ("2 (two processes over Gloo)", two_process)):
        if time_left() < 20:
            print(f"SKIPPED part {name}: {time_left():.0f} s of the budget left", flush=True)
            skipped.append(name)
            continue
        part(args, failures)
    print(f"bench_ddp_hooks: {len(failures)} check(s) failed" if failures else
          f"bench_ddp_hooks: all checks that ran passed{' (some skipped)' if skipped else ''}")
    return 1 if failures else 3 if skipped else 0


if __name__ == "__main__":
    sys.exit(main())
