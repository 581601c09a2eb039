"""Running rollouts: one (rollout.py) or many (the collector), and recording them."""
