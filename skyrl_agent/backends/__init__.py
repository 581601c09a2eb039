"""What is a backend (Tinker's primitives): the protocol, torch in one process, FSDP2 and
Megatron ranks, forward/backward passes, losses and corrections, and building one from the
config. Used by `rl/` and the Tinker server alike; never imports `rl/` or `inference/`."""
