from experiments.failure_sim import cli

if __name__ == "__main__":
  cli.main()
