"""The bad-input battery: acceptance cases run through the real command line.

  python -m tests.acceptance.bad_inputs [--quick] [--only CLASS]   # from the repository root

bad_inputs.py runs the cases (cases_*.py) and judges them (judge.py); lib.py holds what they share.
test_battery.py runs the --quick subset under pytest. The full battery's report goes to
experiments/results/bad_inputs.json and .md.
"""
