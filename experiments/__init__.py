"""Benchmarks, paper reproductions and notebooks; never imported by medjax or by tests/.

Each script runs from the repository root as a module, with medjax installed (`pip install -e .`):

  python -m experiments.bench_recovery --help

and writes its numbers to experiments/results/. experiments/tests/ tests the code here.
"""
