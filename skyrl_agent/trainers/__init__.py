"""Trainers: stored trajectories into better weights."""
