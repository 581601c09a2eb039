"""`python -m skyrl_agent.inference.server`: the same as `skyrl-agent serve`."""

from skyrl_agent.cli import main

if __name__ == "__main__":
    main(["serve", *__import__("sys").argv[1:]])
