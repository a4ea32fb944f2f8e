#!/usr/bin/env python3
"""Summarises bench_comm runs: the median, over runs, of each variant's median ratio to
raw MPI in the same run, and the spread (lowest-highest) of that ratio across runs.

  for i in 1 2 3; do
    mpiexec --allow-run-as-root --oversubscribe -n 2 build/bench/bench_comm \\
      --benchmark_format=json --benchmark_out=p2_$i.json > /dev/null
  done
  python3 bench/bench_comm_table.py p2_*.json

With `--before old_*.json` (runs of a bench_comm built from an earlier commit, interleaved
with these), a column "default before" gives the earlier default MpiComm's ratio.
"""
import json
import statistics
import sys

VARIANTS = ["default", "p2p", "checked", "unchecked", "unchecked_nostage", "nostage", "known", "raw_nb"]


def load(paths):
    return [json.load(open(p))["benchmarks"] for p in paths]


def rows_named(runs, name):
    return [next(b for b in r if b["name"] == name) for r in runs if any(b["name"] == name for b in r)]


def cell(xs):
    xs = sorted(xs)
    return f"{statistics.median(xs):.2f} [{xs[0]:.2f}-{xs[-1]:.2f}]" if xs else "-"


def main(args):
    before = []
    if "--before" in args:
        i = args.index("--before")
        before, args = load(args[i + 1:]), args[:i]
    runs = load(args)
    print(f"runs: {len(runs)}" + (f" (before: {len(before)})" if before else "") +
          "; cell: median ratio over runs [lowest-highest]")
    head = (["default before"] if before else []) + VARIANTS
    print("| operation | raw MPI (µs, median) | " + " | ".join(head) + " |")
    print("|---" * (len(head) + 2) + "|")
    for name in [b["name"] for b in runs[0]]:
        rows = rows_named(runs, name)
        cells = [name.split("/iterations")[0], f"{statistics.median(b['raw'] for b in rows):.1f}"]
        if before:
            cells.append(cell(b["default_x"] for b in rows_named(before, name) if "default_x" in b))
        for v in VARIANTS:
            cells.append(cell(b[v + "_x"] for b in rows if v + "_x" in b))
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
