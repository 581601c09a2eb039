"""R3 on a GPU, at a size where routing near-ties are common: a random Qwen3-MoE (8 layers,
64 experts, top-8, hidden 1024, routers at transformers' 0.02 initialization) samples in
bfloat16 with a KV cache, one token at a time for a batch of sequences (the sampler's kernels and
shapes); the trainer then scores the same sequences in one forward (the trainer's), in float32
and in bfloat16, with and without replaying the sampler's routing. Reported: the share of
(token, layer) routing decisions where the trainer's own top-k differs from the sampler's, and
the logprob gap on the sampled tokens (max, mean, k3 KL(sampler || trainer)).

Needs only torch and transformers (the GPU machine's own), and skyrl_agent.model.routers.

Run: python benchmarks/r3_gpu.py   (one GPU, under a minute; writes
benchmarks/results/r3_gpu.md; `--small` runs a CPU-sized model to check the script)
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.cache_utils import DynamicCache

from skyrl_agent.model.routers import ReplayCount, RoutingTap, replayed_routing

RESULTS = Path(__file__).parent / "results" / "r3_gpu.md"


def build(small: bool, device: torch.device) -> Qwen3MoeForCausalLM:
    size = (dict(hidden_size=64, moe_intermediate_size=32, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=16,
                 num_experts_per_tok=4, vocab_size=512) if small else
            dict(hidden_size=1024, moe_intermediate_size=256, num_hidden_layers=8,
                 num_attention_heads=16, num_key_value_heads=4, head_dim=64, num_experts=64,
                 num_experts_per_tok=8, vocab_size=32000))
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**size, intermediate_size=1024,
                                               norm_topk_prob=True, max_position_embeddings=4096))
    with torch.no_grad():  # transformers starts routers at zero: every expert would tie
        for name, param in model.named_parameters():
            if name.endswith("mlp.gate.weight"):
                param.normal_(0.0, 0.02)
    return model.to(device).eval()


@torch.no_grad()
def sample(model: Qwen3MoeForCausalLM, prompts: torch.Tensor, new_tokens: int,
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token-by-token sampling: sequences [B, P+N], sampled logprobs [B, N], and the routing
    of every position the sampler ran [B, P+N-1, layers, top_k]."""
    tap = RoutingTap(model)
    batch = prompts.shape[0]
    cache = DynamicCache()
    out = model(input_ids=prompts, past_key_values=cache, use_cache=True)
    routing = [torch.from_numpy(tap.take()).view(batch, prompts.shape[1], len(tap.routers), -1)]
    tokens, logprobs = [], []
    generator = torch.Generator(device=prompts.device).manual_seed(1)
    for _ in range(new_tokens):
        step = out.logits[:, -1].float().log_softmax(-1)
        token = torch.multinomial(step.exp(), 1, generator=generator)
        tokens.append(token)
        logprobs.append(step.gather(-1, token))
        if len(tokens) == new_tokens:
            break
        out = model(input_ids=token, past_key_values=cache, use_cache=True)
        routing.append(torch.from_numpy(tap.take()).view(batch, 1, len(tap.routers), -1))
    tap.close()
    return (torch.cat([prompts, *tokens], 1), torch.cat(logprobs, 1).cpu(),
            torch.cat(routing, 1))


@torch.no_grad()
def score(model: Qwen3MoeForCausalLM, sequences: torch.Tensor, routing: torch.Tensor,
          new_tokens: int, replay: bool) -> tuple[torch.Tensor, ReplayCount]:
    """The trainer's logprobs of the sampled tokens, replaying the sampler's `routing` or not
    (counting how often its own choice differs either way)."""
    count = ReplayCount()
    inputs = sequences[:, :-1]
    recorded = routing.flatten(0, 1).to(sequences.device)
    with replayed_routing(model, recorded, count, replay=replay):
        logits = model(input_ids=inputs).logits.float()
    picked = logits.log_softmax(-1).gather(-1, sequences[:, 1:, None]).squeeze(-1)
    return picked[:, -new_tokens:].cpu(), count


def gaps(trainer: torch.Tensor, sampler: torch.Tensor) -> dict[str, float]:
    diff = (trainer - sampler).double()
    return {"max": float(diff.abs().max()), "mean": float(diff.abs().mean()),
            "kl": float((diff.exp() - 1 - diff).mean())}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--small", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    device = torch.device("cpu" if args.small else "cuda")
    started = time.monotonic()
    batch, prompt, new = (4, 16, 16) if args.small else (16, 128, 256)
    sampler = build(args.small, device).to(torch.bfloat16)
    prompts = torch.randint(0, sampler.config.vocab_size, (batch, prompt),
                            generator=torch.Generator().manual_seed(2)).to(device)
    sequences, sampled, routing = sample(sampler, prompts, new)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        trainer = build(args.small, device).to(dtype)
        for replay in (False, True):
            logprobs, count = score(trainer, sequences, routing, new, replay)
            rows.append({"trainer": str(dtype).removeprefix("torch."),
                         "r3": "on" if replay else "off", "own": count.share,
                         "used": 0.0 if replay else count.share, **gaps(logprobs, sampled)})
        del trainer
    config = sampler.config
    where = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"
    lines = ["# R3 on a GPU: bfloat16 token-by-token sampler vs one-forward trainer", "",
             f"Command: `python benchmarks/r3_gpu.py` (one {where}, "
             f"{time.monotonic() - started:.0f} s). Random Qwen3-MoE: "
             f"{config.num_hidden_layers} layers, {config.num_experts} experts, "
             f"top-{config.num_experts_per_tok}, hidden {config.hidden_size}; {batch} sequences "
             f"of {prompt} prompt + {new} sampled tokens.",
             "", "| trainer | R3 | own differs | used differs | max gap | mean gap | KL |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['trainer']} | {r['r3']} | {r['own']:.4f} | {r['used']:.4f} "
                     f"| {r['max']:.2e} | {r['mean']:.2e} | {r['kl']:.2e} |")
    args.out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
