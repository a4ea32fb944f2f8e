#!/usr/bin/python3
"""commpact_hooks under PyTorch DDP: 2 CPU processes, Gloo, a file rendezvous.

Checks, each on every rank:
  * gtopk_hook, topk_hook, powersgd_hook, efsign_hook and qsgd_hook keep the parameters
    bit-identical across ranks (every rank gets the same reduced gradient) and the loss
    falls; the residual follows its parameters when DDP rebuilds its buckets;
  * commpact's powersgd_hook equals PyTorch's powerSGD_hook within float tolerance at the
    same matrix_approximation_rank, start_powerSGD_iter and random_seed, while both
    differ clearly from plain allreduce (so the comparison can fail);
  * ModelAverager (Local SGD, QSR) leaves identical parameters after an averaging step
    and different ones between them; QSR's periods stop at lr = 0;
  * a NaN bucket on one rank raises on both, with advice that holds in Python;
  * ranks that register different hooks or state arguments raise alike at once;
  * a bad timeout= is refused; a peer that never joins makes the hook raise after it,
    naming the Python argument.
Run: PYTHONPATH=<build>/python /usr/bin/python3 tests/torch/test_ddp_hooks.py
"""
import datetime
import os
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
from torch.nn.parallel import DistributedDataParallel as DDP

WORLD = 2
STEPS = 60


def model_fn():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                               torch.nn.Linear(64, 4))


def batches(rank, steps, seed=3):
    # A fixed teacher; each rank draws its own inputs.
    g = torch.Generator().manual_seed(seed)
    teacher = torch.randn(32, 4, generator=g)
    gr = torch.Generator().manual_seed(100 + rank)
    out = []
    for _ in range(steps):
        x = torch.randn(16, 32, generator=gr)
        out.append((x, (x @ teacher).argmax(1)))
    return out


def flat_params(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def identical_across_ranks(t):
    parts = [torch.empty_like(t) for _ in range(WORLD)]
    dist.all_gather(parts, t)
    return all(torch.equal(parts[0], p) for p in parts[1:])


def train(rank, hook=None, state=None, steps=STEPS, lr=0.1):
    model = DDP(model_fn(), bucket_cap_mb=0.01)  # several buckets
    if hook is not None:
        model.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for x, y in batches(rank, steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model.module, losses


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def worker(rank, path, failures):
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method="file://" + path, rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=120))
        import commpact_hooks as ch

        # 0. A timeout that is not a positive number of seconds is refused, naming the argument;
        #    so is one longer than 1e9 s (it overflowed the deadlines: timed out at once).
        for bad in (0.0, -1.0, float("nan"), float("inf"), 1e10, 1e16):
            try:
                ch.GTopKState(timeout=bad, name="t/bad-timeout")
                raise AssertionError(f"timeout={bad} was accepted")
            except ValueError as e:
                check("timeout=" in str(e), f"the timeout error does not name the argument: {e}")

        #    Arguments the compressors check are checked when the state is made (not at the
        #    first backward, where the error would also end the state), naming the argument;
        #    a process_group= or store= of another type is a TypeError naming it.
        for make, arg in ((lambda: ch.EFSignState(momentum=float("nan")), "momentum"),
                          (lambda: ch.EFSignState(momentum=1.0), "momentum"),
                          (lambda: ch.QSGDState(momentum=-0.5), "momentum"),
                          (lambda: ch.QSGDState(levels=0), "levels"),
                          (lambda: ch.QSGDState(levels=70000), "levels"),
                          (lambda: ch.PowerSGDState(min_compression_rate=float("nan")), "min_compression_rate"),
                          (lambda: ch.PowerSGDState(min_compression_rate=-1.0), "min_compression_rate"),
                          (lambda: ch.GTopKState(process_group=123), "process_group="),
                          (lambda: ch.TopKState(store="a store"), "store="),
                          (lambda: ch.ModelAverager(process_group=object()), "process_group=")):
            try:
                make()
                raise AssertionError(f"a bad {arg} was accepted")
            except (ValueError, RuntimeError, TypeError) as e:
                check(arg in str(e) and "Unable to cast" not in str(e), f"the bad {arg}'s error: {e}")
                check(isinstance(e, TypeError) == arg.endswith("="), f"the bad {arg}'s error type: {type(e)}")

        # 1. Each hook: identical parameters on every rank, the loss falls.
        states = {
            "gtopk": (ch.gtopk_hook, ch.GTopKState(density=0.1, name="t/gtopk")),
            "topk": (ch.topk_hook, ch.TopKState(density=0.1, name="t/topk")),
            "powersgd": (ch.powersgd_hook, ch.PowerSGDState(matrix_approximation_rank=2, start_powerSGD_iter=2,
                                                            name="t/psgd")),
            "efsign": (ch.efsign_hook, ch.EFSignState(name="t/efsign")),
            "qsgd": (ch.qsgd_hook, ch.QSGDState(levels=16, bucket=128, seed=1, name="t/qsgd")),
        }
        for name, (hook, state) in states.items():
            model, losses = train(rank, hook, state)
            check(identical_across_ranks(flat_params(model)), f"{name}: parameters differ across ranks")
            first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
            check(last < 0.8 * first, f"{name}: the loss did not fall enough ({first:.4f} -> {last:.4f})")
            check(state.bytes_sent() > 0, f"{name}: no bytes counted")
            state.synchronize()  # CPU buckets: nothing in flight, returns at once

        # 1b. DDP rebuilds its buckets after the first iteration (this model's one bucket
        #     reverses its order: a, b -> b, a). The residual follows the parameters: `a` gets
        #     the gradient 1..10 at step 0 only, on both ranks, and k = 1 of 20 (density 0.05),
        #     so gTop-k and Top-k deliver a[9] = 10, then from the residual a[8] = 9 and a[7] = 8;
        #     `b`, which never had a gradient, gets nothing. EF-SignSGD and QSGD: nothing in `b`.
        class TwoParams(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.a = torch.nn.Parameter(torch.zeros(10))
                self.b = torch.nn.Parameter(torch.zeros(10))

            def forward(self, x, y):
                return (self.a * x).sum() + (self.b * y).sum()

        for name, hook, state in (("gtopk", ch.gtopk_hook, ch.GTopKState(density=0.05, name="t/rb-gtopk")),
                                  ("topk", ch.topk_hook, ch.TopKState(density=0.05, name="t/rb-topk")),
                                  ("efsign", ch.efsign_hook, ch.EFSignState(name="t/rb-efsign")),
                                  ("qsgd", ch.qsgd_hook, ch.QSGDState(levels=4, bucket=5, name="t/rb-qsgd"))):
            m = TwoParams()
            ddp = DDP(m)
            orders = []

            def watch(st, bucket, hook=hook, m=m, orders=orders):
                orders.append(["ab"[[id(m.a), id(m.b)].index(id(p))] for p in bucket.parameters()])
                return hook(st, bucket)

            ddp.register_comm_hook(state, watch)
            zero = torch.zeros(10)
            for t in range(3):
                m.zero_grad()
                ddp(torch.arange(1.0, 11.0) if t == 0 else zero, zero).backward()
                check(not m.b.grad.any(), f"{name} step {t}: b, which never had a gradient, got {m.b.grad.tolist()}")
                if name in ("gtopk", "topk"):
                    want = torch.zeros(10)
                    want[9 - t] = 10.0 - t
                    check(torch.equal(m.a.grad, want),
                          f"{name} step {t}: a.grad {m.a.grad.tolist()}, not {want.tolist()}")
                elif t > 0:
                    check(m.a.grad.any(), f"{name} step {t}: a's residual was not sent")
            check(orders[0] != orders[1], f"DDP did not reorder the bucket ({orders[:2]}): the check tests nothing")

        # 1c. A zero-size parameter (no place in the bucket) is left out of the layouts.
        for name, hook, state in (("efsign", ch.efsign_hook, ch.EFSignState(name="t/empty-efsign")),
                                  ("powersgd", ch.powersgd_hook,
                                   ch.PowerSGDState(start_powerSGD_iter=2, name="t/empty-psgd"))):
            class WithEmpty(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.body = model_fn()
                    self.empty = torch.nn.Parameter(torch.zeros(0))

                def forward(self, x):
                    return self.body(x) + self.empty.sum()

            net = WithEmpty()
            ddp = DDP(net)
            ddp.register_comm_hook(state, hook)
            for x, y in batches(rank, 4):
                ddp.zero_grad()
                torch.nn.functional.cross_entropy(ddp(x), y).backward()
            check(identical_across_ranks(torch.cat([p.grad.reshape(-1) for p in net.parameters()])),
                  f"{name} with a zero-size parameter: gradients differ across ranks")

        # 2. commpact's PowerSGD against PyTorch's powerSGD_hook at the same rank and seed;
        #    min_compression_rate 0 compresses every matrix; rank 64 is the full rank of the
        #    64 x 64 layer, whose gradient has the zero rows of dead units (both then give the
        #    allreduce).
        dense, _ = train(rank, steps=12)
        for r, rate in ((1, 2.0), (2, 2.0), (64, 0.0)):
            ref_state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=r, start_powerSGD_iter=2,
                                           min_compression_rate=rate, random_seed=5, use_error_feedback=True,
                                           warm_start=True)
            ref, _ = train(rank, psgd.powerSGD_hook, ref_state, steps=12)
            mine, _ = train(rank, ch.powersgd_hook,
                            ch.PowerSGDState(matrix_approximation_rank=r, start_powerSGD_iter=2, random_seed=5,
                                             min_compression_rate=rate, name=f"t/psgd-ref{r}-{rate}"), steps=12)
            a, b, d = flat_params(ref), flat_params(mine), flat_params(dense)
            err = (a - b).abs().max().item()
            gap = (a - d).abs().max().item()
            check(torch.allclose(a, b, rtol=1e-4, atol=1e-5),
                  f"rank {r}, min_compression_rate {rate}: commpact's PowerSGD differs from PyTorch's by {err:.3e}")
            if r < 64:
                check(gap > 100 * max(err, 1e-7),
                      f"rank {r}: PowerSGD is too close to allreduce ({gap:.3e}) to tell")
            if rank == 0:
                print(f"PowerSGD rank {r}, min_compression_rate {rate}, 12 steps: max |commpact - PyTorch| = "
                      f"{err:.2e}, max |PyTorch PowerSGD - allreduce| = {gap:.2e}", flush=True)

        # 2b. At min_compression_rate 0 PyTorch compresses the biases too, and their Q draws
        #     come first in the stream: the gradients of the first compressed iteration are
        #     PyTorch's (before the hook drew the vectors' Qs, off by 1e-2 at rank 2). Over
        #     12 steps the 4 x 64 layer drifts by 1.6e-5: PyTorch orthogonalises the warm-start
        #     Q, commpact does not (the same in exact arithmetic; docs/pytorch.md).
        def first_compressed_grads(hook, st):
            model = DDP(model_fn(), bucket_cap_mb=0.01)
            model.register_comm_hook(st, hook)
            for x, y in batches(rank, 3):  # iterations 0 and 1 dense, 2 compressed
                model.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
            return torch.cat([p.grad.reshape(-1) for p in model.module.parameters()])
        ga = first_compressed_grads(psgd.powerSGD_hook, psgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2, min_compression_rate=0.0,
            random_seed=5))
        gb = first_compressed_grads(ch.powersgd_hook, ch.PowerSGDState(
            matrix_approximation_rank=2, start_powerSGD_iter=2, min_compression_rate=0.0, random_seed=5,
            name="t/psgd-rate0"))
        check(torch.allclose(ga, gb, rtol=1e-4, atol=1e-5),
              f"min_compression_rate 0: the first compressed gradients differ from PyTorch's by "
              f"{(ga - gb).abs().max().item():.3e}")
        if rank == 0:
            print(f"PowerSGD rank 2, min_compression_rate 0, first compressed iteration: max |commpact - PyTorch| = "
                  f"{(ga - gb).abs().max().item():.2e}", flush=True)

        # 3. Model averaging: Local SGD (period 3) and QSR.
        for avg in (ch.ModelAverager(period=3, name="t/local"), ch.ModelAverager(period=2, qsr_alpha=0.05,
                                                                                 name="t/qsr")):
            model = model_fn()
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            synced = []
            for x, y in batches(rank, 12):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x), y).backward()
                opt.step()
                did = avg.step(model.parameters(), 0.1)  # a generator, as PyTorch's averagers take
                same = identical_across_ranks(flat_params(model))
                check(same == did, f"averager: averaged={did} but identical={same}")
                synced.append(did)
            check(synced.count(True) == avg.rounds and avg.rounds >= 2, f"averager: rounds {avg.rounds}")
        #    QSR with a schedule that ends at lr = 0: H = max(2, floor((0.2 / 0.1)^2)) = 4 at lr 0.1,
        #    and no period ends once lr is 0 (it saturated and overflowed the step before).
        avg = ch.ModelAverager(period=2, qsr_alpha=0.2, name="t/qsr0")
        model = model_fn()
        rounds = [step for step, lr in enumerate([0.1] * 4 + [0.0] * 8, start=1)
                  if avg.step(list(model.parameters()), lr)]
        check(rounds == [4, 8], f"QSR down to lr = 0 averaged after steps {rounds}, not [4, 8]")
        #    Ranks with different periods (2 and 3) raise at the first round where they part.
        avg = ch.ModelAverager(period=2 + rank, name="t/apart")
        try:
            for _ in range(6):
                avg.step(list(model.parameters()), 0.1)
            raise AssertionError("averagers with periods 2 and 3 did not raise")
        except RuntimeError as e:
            check("step of this averaging round" in str(e), f"periods that differ: {e}")
        dist.barrier()
        #    Ranks that pass parameters of the same total length in another order raise alike
        #    (the shapes are agreed with the step), before anything is averaged.
        ps = [torch.ones(6), torch.ones(2)] if rank == 0 else [torch.ones(2), torch.ones(6)]
        try:
            ch.ModelAverager(period=1, name="t/order").step(ps, 0.1)
            raise AssertionError("parameters in another order were averaged")
        except RuntimeError as e:
            check("parameter shapes" in str(e) and "same order" in str(e), f"parameters in another order: {e}")
        check(all(bool((p == 1).all()) for p in ps), "parameters in another order: a parameter changed")
        dist.barrier()

        # 4. start_powerSGD_iter < 2 raises as PyTorch's PowerSGDState does (the rebuild).
        try:
            ch.PowerSGDState(start_powerSGD_iter=1)
            raise AssertionError("start_powerSGD_iter = 1 did not raise")
        except (ValueError, RuntimeError) as e:
            check("start_powerSGD_iter" in str(e), f"the bad start_powerSGD_iter's error does not name it: {e}")
        #    A bad density raises in the constructor; a state made after one that failed
        #    (aborted on every rank) works under the same default name: it does not read the
        #    old state's failure notice.
        try:
            ch.GTopKState(density=0.0)
            raise AssertionError("density = 0 did not raise")
        except (ValueError, RuntimeError) as e:
            check("density" in str(e), f"the bad density's error does not name it: {e}")
        ch.GTopKState(density=0.1).abort("simulated failure of an earlier state")
        dist.barrier()
        model, _ = train(rank, ch.gtopk_hook, ch.GTopKState(density=0.1), steps=3)
        check(identical_across_ranks(flat_params(model)), "the state made after a failed one: replicas differ")

        # 4b. An Inf in one rank's input (so NaN in its bucket) raises on both ranks, in that
        #     backward; the error says what holds in Python (no on_nonfinite option here).
        state = ch.GTopKState(density=0.1, name="t/nonfinite")
        model = DDP(model_fn(), bucket_cap_mb=0.01)
        model.register_comm_hook(state, ch.gtopk_hook)
        x, y = batches(rank, 1)[0]
        torch.nn.functional.cross_entropy(model(x), y).backward()  # a good iteration 0 (DDP rebuilds after it)
        if rank == 1:
            x = x.clone()
            x[0, 0] = float("inf")
        try:
            torch.nn.functional.cross_entropy(model(x), y).backward()
            raise AssertionError("a NaN bucket on rank 1 did not raise")
        except RuntimeError as e:
            msg = str(e)
            check("not finite" in msg and "Fix the gradient (lower the learning rate, clip); commpact_hooks cannot skip" in msg
                  and "GradScaler" in msg, f"the non-finite error: {msg}")
            # DDP's count, not the rebuilt bucket compressor's (its step 0)
            check("at iteration 1 of this state (DDP bucket " in msg and "at step" not in msg,
                  f"the non-finite error does not name the iteration: {msg}")
            check("on_nonfinite" not in msg, f"the error names the C++ option on_nonfinite: {msg}")
        #    The state failed; a later backward (a new DDP model: the failed backward leaves
        #    DDP's reducer unusable) says so with the same Python advice (the reason the
        #    communicator keeps is the Python message) and asks for a new state.
        model = DDP(model_fn(), bucket_cap_mb=0.01)
        model.register_comm_hook(state, ch.gtopk_hook)
        try:
            torch.nn.functional.cross_entropy(model(x), y).backward()
            raise AssertionError("a failed state ran another step")
        except RuntimeError as e:
            msg = str(e)
            check("failed earlier" in msg and "at iteration 1 of this state" in msg and "on_nonfinite" not in msg
                  and "Make a new state" in msg and "Build a new group" not in msg,
                  f"the failed state's later error: {msg}")
        dist.barrier()

        # 4b'. One PowerSGDState on two models (the docs ask for one per model): a bucket that
        #      comes with other parameters gets a compressor of its own, so the second model,
        #      whose gradient is zero, gets zero (the first model's residual used to reach it).
        state = ch.PowerSGDState(matrix_approximation_rank=1, start_powerSGD_iter=2, name="t/psgd-two")
        m1, m2 = DDP(model_fn()), DDP(model_fn())
        m1.register_comm_hook(state, ch.powersgd_hook)
        m2.register_comm_hook(state, ch.powersgd_hook)
        for x, y in batches(rank, 4):
            for m, scale in ((m1, 1.0), (m2, 0.0)):
                m.zero_grad()
                (scale * torch.nn.functional.cross_entropy(m(x), y)).backward()
            top = max(p.grad.abs().max().item() for p in m2.parameters())
            check(top == 0.0, f"one PowerSGD state on two models: the zero-loss model got gradients up to {top}")
        dist.barrier()

        # 4d. A bucket that is not float32 on one rank (a float64 model there; a float64
        #     ModelAverager parameter): that rank raises at once, and the abort reaches the other
        #     rank at once too, instead of after its timeout. Each on a group of its own: the
        #     other rank's abandoned collective stays there.
        g = dist.new_group([0, 1])
        state = ch.GTopKState(process_group=g, density=0.1, timeout=60.0, name="t/dtype")
        model = DDP(model_fn().double() if rank == 1 else model_fn(), process_group=g)
        model.register_comm_hook(state, ch.gtopk_hook)
        x, y = batches(rank, 1)[0]
        t0 = time.monotonic()
        try:
            torch.nn.functional.cross_entropy(model(x.double() if rank == 1 else x), y).backward()
            raise AssertionError("a float64 bucket on rank 1 did not raise")
        except RuntimeError as e:
            check("float32" in str(e), f"the float64 bucket's error: {e}")
            check(time.monotonic() - t0 < 10, "the float64 bucket's error came late")
        g = dist.new_group([0, 1])
        avg = ch.ModelAverager(process_group=g, period=1, timeout=60.0, name="t/dtype-avg")
        p = torch.ones(4, dtype=torch.float64 if rank == 1 else torch.float32)
        t0 = time.monotonic()
        try:
            avg.step([p], 0.1)
            raise AssertionError("a float64 parameter on rank 1 was averaged")
        except RuntimeError as e:
            check("float32" in str(e), f"the float64 parameter's error: {e}")
            check(time.monotonic() - t0 < 10, "the float64 parameter's error came late")
        check(bool((p == 1).all()), "the float64 parameter's error: a parameter changed")
        dist.barrier()

        # 4c. Ranks that register different hooks (gTop-k's tree against Top-k's allgather
        #     waited until the timeout) or other state arguments raise alike at once.
        x, y = batches(rank, 1)[0]
        for case, mine in enumerate((("gtopk", "topk"), ("gtopk", "gtopk"))):
            dens = (0.1, 0.1) if mine[0] != mine[1] else (0.1, 0.2)
            kind = (ch.gtopk_hook, ch.GTopKState) if mine[rank] == "gtopk" else (ch.topk_hook, ch.TopKState)
            hook, state = kind[0], kind[1](density=dens[rank], timeout=60.0, name=f"t/differ{case}")
            model = DDP(model_fn(), bucket_cap_mb=0.01)
            model.register_comm_hook(state, hook)
            t0 = time.monotonic()
            try:
                torch.nn.functional.cross_entropy(model(x), y).backward()
                raise AssertionError(f"ranks with {mine} and densities {dens} did not raise")
            except RuntimeError as e:
                msg = str(e)
                check("registered different hooks" in msg and f"{mine[rank]}_hook(density={dens[rank]}" in msg,
                      f"the different hooks' error: {msg}")
                check(time.monotonic() - t0 < 10, "the different hooks' error came late")
            dist.barrier()

        # 5. A rank that fails (and aborts the hook's communicator) makes the other rank's
        #    hook raise within seconds instead of waiting for the 60 s deadline. Last: the
        #    abandoned collective leaves the group unusable, so the processes end here.
        state = ch.GTopKState(density=0.1, timeout=60.0, name="t/fail")
        model = DDP(model_fn(), bucket_cap_mb=0.01)
        model.register_comm_hook(state, ch.gtopk_hook)
        x, y = batches(rank, 1)[0]
        for _ in range(2):  # good steps (DDP rebuilds its buckets, collectively, in the second forward)
            torch.nn.functional.cross_entropy(model(x), y).backward()
        out = model(x)
        if rank == 1:
            time.sleep(0.5)
            state.abort("simulated loss of a data loader")
            time.sleep(3)  # stay until rank 0 raised (its check waits for this rank's "ok" only)
        else:
            t0 = time.monotonic()
            try:
                torch.nn.functional.cross_entropy(out, y).backward()
                raise AssertionError("backward returned although rank 1 aborted")
            except RuntimeError as e:
                waited = time.monotonic() - t0
                check("simulated loss of a data loader" in str(e), f"the error does not carry the reason: {e}")
                check(waited < 10, f"the hook raised only after {waited:.1f} s")
        failures.put("ok")
        os._exit(0)  # skip the group's teardown (it would wait for the abandoned collective)
    except Exception:
        failures.put(f"rank {rank}:\n{traceback.format_exc()}")
        raise


def worker_timeout(rank, path, failures):
    """6. (fresh processes: the abandoned collective leaves the group unusable) A peer that
    never joins makes the hook raise after the state's timeout, and the advice names the
    Python argument (timeout=), not the C++ option."""
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method="file://" + path, rank=rank, world_size=WORLD,
                                timeout=datetime.timedelta(seconds=120))
        import commpact_hooks as ch
        state = ch.GTopKState(density=0.1, timeout=1.0, name="t/timeout")
        model = DDP(model_fn(), bucket_cap_mb=0.01)
        model.register_comm_hook(state, ch.gtopk_hook)
        x, y = batches(rank, 1)[0]
        for _ in range(2):  # good steps (the bucket rebuild is collective)
            torch.nn.functional.cross_entropy(model(x), y).backward()
        if rank == 1:
            time.sleep(6)  # never joins the third step; stays until rank 0 timed out
        else:
            t0 = time.monotonic()
            try:
                torch.nn.functional.cross_entropy(model(x), y).backward()
                raise AssertionError("backward returned although rank 1 never joined")
            except RuntimeError as e:
                waited, msg = time.monotonic() - t0, str(e)
                check("timed out" in msg and "timeout= (seconds)" in msg, f"the timeout error: {msg}")
                check("torch_options" not in msg, f"the timeout error names the C++ option: {msg}")
                check(waited < 5, f"the hook raised only after {waited:.1f} s (timeout=1.0)")
        failures.put("ok")
        os._exit(0)
    except Exception:
        failures.put(f"rank {rank}:\n{traceback.format_exc()}")
        raise


def run_world(target, tmp):
    """Runs target(rank, rendezvous, failures) on WORLD processes; returns the failures' text or None."""
    ctx = mp.get_context("spawn")
    failures = ctx.SimpleQueue()
    procs = [ctx.Process(target=target, args=(r, os.path.join(tmp, target.__name__), failures)) for r in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=500)
    bad = [p for p in procs if p.exitcode != 0]
    for p in procs:
        if p.is_alive():
            p.kill()
    msgs = []
    while not failures.empty():
        msgs.append(failures.get())
    done = msgs.count("ok")
    msgs = [m for m in msgs if m != "ok"]
    if bad or msgs or done != WORLD:
        return "\n".join(msgs) or f"{target.__name__}: exit codes {[p.exitcode for p in procs]}"
    return None


def arguments_before_group():
    """Without a process group a bad argument is still the error: the states check their
    arguments before they resolve the group (it used to say only that the default group
    was not initialized), and the message starts with the Python name."""
    import commpact_hooks as ch
    for make, arg in ((lambda: ch.GTopKState(density=0.0), "density"),
                      (lambda: ch.TopKState(density=2.0), "density"),
                      (lambda: ch.PowerSGDState(matrix_approximation_rank=0), "matrix_approximation_rank"),
                      (lambda: ch.PowerSGDState(start_powerSGD_iter=1), "start_powerSGD_iter"),
                      (lambda: ch.ModelAverager(period=0), "period"),
                      (lambda: ch.ModelAverager(qsr_alpha=float("nan")), "qsr_alpha"),
                      (lambda: ch.QSGDState(levels=0), "levels")):
        try:
            make()
            return f"a bad {arg} was accepted without a process group"
        except (ValueError, RuntimeError) as e:
            if arg not in str(e) or not str(e).startswith("commpact_hooks.") or "process group" in str(e):
                return f"the bad {arg}'s error without a process group: {e}"
    return None


def main():
    sys.path.insert(0, os.environ.get("PYTHONPATH", "."))
    failed = arguments_before_group()
    if failed:
        print(failed, file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as tmp:
        for target in (worker, worker_timeout):
            failed = run_world(target, tmp)
            if failed:
                print(failed, file=sys.stderr)
                return 1
    print("test_ddp_hooks: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
