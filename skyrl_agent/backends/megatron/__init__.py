"""The Megatron backend: megatron-core's GPTModel, tensor parallel (and data parallel across
tensor-parallel groups), behind the same Tinker-shaped protocol as the torch backends."""
