"""How weights travel from the trainer to the inference servers.

A `WeightUpdate` (transport.py) is what a backend produces and what every transport delivers.
On one machine it is a safetensors file in shared memory: the trainer writes it through a
read-write mapping (writer.py: one in-place copy, or none once the trainer's CPU parameters live
in it) and the server loads it by path (reader.py: one copy into its model), only from folders the
run wrote (folders.py). Files are named after their trainer's process; those of dead processes are
removed (files.py). The caller sequences each round: export, server load, next optimizer step.
"""
