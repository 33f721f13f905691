"""medjax from a checkout: `python launch.py --config configs/quickstart.py`.

The same command as `medjax` and `python -m medjax` once the package is installed
(`pip install -e .`); the flags and roles are `medjax.cli`'s.
"""

from medjax import cli

if __name__ == "__main__":
  cli.run()
