"""A small GPT-2 (Hugging Face transformers) with Boltzmann attention, trained on Tiny Shakespeare, then sampled.

The attention is converted to h+J Boltzmann attention with a coupled window: the last ``--window`` keys of
each query are coupled by a learned J (exact marginals, any length), earlier keys are independent spins
(sigmoid attention). Characters are the tokens (the package's bundled Tiny Shakespeare, 65 symbols).

    python examples/transformers_shakespeare.py              # 300 steps of a 4-layer model on the CPU
    python examples/transformers_shakespeare.py --quick      # a tiny model, a few steps: a smoke test
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from transformers import GPT2Config, GPT2LMHeadModel

from boltzmann_attention.experiments.data import ShakespeareData
from boltzmann_attention.integrations import transformers as bt


def main(argv: list[str] | None = None) -> GPT2LMHeadModel:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=None, help="training steps (default 300, --quick: 5)")
    parser.add_argument("--window", type=int, default=8, help="coupled keys per query (coupling_window)")
    parser.add_argument("--quick", action="store_true", help="a tiny model and a few steps (seconds)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    steps = args.steps if args.steps is not None else (5 if args.quick else 300)
    T, batch, width, layers = (16, 4, 32, 1) if args.quick else (64, 16, 128, 4)

    torch.manual_seed(args.seed)
    data = ShakespeareData()
    config = GPT2Config(vocab_size=data.vocab_size, n_positions=T, n_embd=width, n_layer=layers, n_head=4,
                        bos_token_id=None, eos_token_id=None)
    model = GPT2LMHeadModel(config)
    bt.convert(model, mode="h+J", coupling="window", coupling_window=min(args.window, T))
    # no weight decay on the couplings and field biases (parameter_groups reads the library's marks)
    optimizer = torch.optim.AdamW(bt.parameter_groups(model, weight_decay=0.1), lr=3e-3)

    generator = torch.Generator().manual_seed(args.seed)
    model.train()
    for step in range(1, steps + 1):
        x, y = data.train_batch(batch, T, generator)
        loss = F.cross_entropy(model(x).logits.flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if step == 1 or step % max(1, steps // 10) == 0 or step == steps:
            print(f"step {step:4d}  train loss {loss.item():.3f}")

    model.eval()
    x, y = data.val_windows(T, max_windows=64)
    with torch.no_grad():
        val = F.cross_entropy(model(x).logits.flatten(0, 1), y.flatten())
    print(f"validation loss {val.item():.3f} (uniform guess: {torch.log(torch.tensor(data.vocab_size)).item():.3f})")

    prompt = data.vocab.encode("\n").unsqueeze(0)  # generate() decodes with the KV cache, one token at a time
    sample = model.generate(prompt, max_new_tokens=T - 1, do_sample=True, top_k=10, pad_token_id=0,
                            attention_mask=torch.ones_like(prompt))
    print("sample:", data.vocab.decode(sample[0]))
    return model


if __name__ == "__main__":
    main()
