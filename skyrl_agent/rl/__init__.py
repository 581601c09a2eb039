"""What drives a backend (the cookbook's side): the fully async loop and the one-sitting reference
loop beside it, one step, packing trajectories into data, advantages, checkpoints, metrics, the
dry-run estimate and SFT. Speaks to a backend only through `backends.backend.TrainerBackend`;
never imports `inference/` (the servers reach it as `rl.workers.ServerControl`)."""
