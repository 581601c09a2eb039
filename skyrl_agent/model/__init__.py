"""What the sampler and the trainer must agree on: model names and folders (`names`), loading
(`loading`: dtype, device, LoRA), image inputs (`vision`), MoE routers (`routers`: the sampler's
tap and the trainer's replay) and the weights that travel between them (`weights/`)."""
