"""How weights travel from the trainer to the inference server.

On one machine they go through shared memory: the trainer keeps a safetensors file on /dev/shm
whose tensor data is mapped read-write into the trainer (`SharedWeights`). Exporting is one
in-place copy into that mapping, or none when the trainer's CPU parameters live in it
(`SharedWeights.adopt`). The server then loads the file by path
(`skyrl_agent.inference.server.weights.load_weights`), one copy from the mapping into its model.
The caller sequences each round: export, server load, then the next optimizer step.
Files are named after their trainer's process; those of dead processes are removed
(inference/weight_files.py).
"""

from skyrl_agent.inference.weight_files import shared_memory_dir
from skyrl_agent.trainers.weight_sync.shared_memory import SharedWeights

__all__ = ["SharedWeights", "shared_memory_dir"]
