#!/usr/bin/env python3
"""Summarises bench_comm runs: the median, over runs, of each variant's median ratio to
raw MPI in the same run, and the spread (lowest-highest) of that ratio across runs.

  for i in 1 2 3; do
    mpiexec --allow-run-as-root --oversubscribe -n 2 build/bench/bench_comm \\
      --benchmark_format=json --benchmark_out=p2_$i.json > /dev/null
  done
  python3 bench/bench_comm_table.py p2_*.json
"""
import json
import statistics
import sys

VARIANTS = ["default", "checked", "unchecked", "unchecked_nostage", "known", "raw_nb"]


def main(paths):
    runs = [json.load(open(p))["benchmarks"] for p in paths]
    print(f"runs: {len(runs)}; cell: median ratio over runs [lowest-highest]")
    print("| operation | raw MPI (µs, median) | " + " | ".join(VARIANTS) + " |")
    print("|---" * (len(VARIANTS) + 2) + "|")
    for name in [b["name"] for b in runs[0]]:
        rows = [next(b for b in r if b["name"] == name) for r in runs if any(b["name"] == name for b in r)]
        cells = [name.split("/iterations")[0], f"{statistics.median(b['raw'] for b in rows):.1f}"]
        for v in VARIANTS:
            xs = sorted(b[v + "_x"] for b in rows if v + "_x" in b)
            cells.append(f"{statistics.median(xs):.2f} [{xs[0]:.2f}-{xs[-1]:.2f}]" if xs else "-")
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
