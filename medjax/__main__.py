"""`python -m medjax`: the `medjax` command (`medjax.cli`)."""

from medjax import cli

if __name__ == "__main__":
  cli.run()
