"""Running rollouts: one sample (one_sample.py) or streams of groups (collector.py), the model
access they sample through (model_access.py), and the failure policy that decides what counts."""
