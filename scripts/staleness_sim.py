#!/usr/bin/env python3
"""The default job's staleness, simulated in one PyTorch process: what a gradient one or
two updates old costs, and what each remedy buys back (README, "Scaling: workers and
accuracy").

    /usr/bin/python3 scripts/staleness_sim.py --mode MODE [--seed 1] [--probs 0.35,0.5,0.15]

The model, data and schedule of configs/fashion_mnist_mlp.flags (scripts/pytorch_mlp.py):
batch 512 of Nesterov momentum 0.9, lr 0.1 warmed up over 100 steps, cosine, 15 epochs. As
in the job with 8 workers and --softsync=0, each update is the mean of 8 chunks of 64; each
chunk's gradient is computed on the weights 0, 1 or 2 updates old, drawn with --probs (the
default's mean, 0.8, is what the job's servers measure at 8 workers). Modes:
  bsp     every chunk fresh (the reference)
  stale   chunks as old as drawn, nothing done about it
  weight  each chunk weighted by 1 / (1 + staleness)       (--staleness_lr=inverse)
  look    chunks computed on weights moved ahead along the momentum by --k updates' worth
          (lr * momentum * k * velocity, a first-order --pull_lookahead)
  wlook   weight and look together
  dc      delay-compensated gradients (DC-ASGD, Zheng et al. 2017), g + lam * g * g * dw
Prints the final test accuracy. One run takes about a minute on one core.
"""
import argparse
import math
import os
import random
import sys

import torch
from torch import nn
from torch.nn.utils.stateless import functional_call

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pytorch_mlp import load, make_model  # noqa: E402

MODES = ("bsp", "stale", "weight", "look", "wlook", "dc")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=MODES, default="bsp")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--probs", default="0.35,0.5,0.15",
                   help="chance of a chunk being 0, 1, 2, ... updates old")
    p.add_argument("--workers", type=int, default=8, help="chunks per batch of 512")
    p.add_argument("--k", type=float, default=0.8, help="look: updates to look ahead")
    p.add_argument("--lam", type=float, default=0.04, help="dc: lambda")
    p.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    a = p.parse_args()
    probs = [float(x) for x in a.probs.split(",")]
    if a.epochs < 1 or a.workers < 1 or not probs or min(probs) < 0 or sum(probs) <= 0:
        sys.exit("staleness_sim.py: --epochs, --workers >= 1; --probs non-negative, not all 0")

    torch.set_num_threads(1)
    torch.manual_seed(a.seed)
    random.seed(a.seed)
    train_x, train_y = load(a.data_dir, "train")
    test_x, test_y = load(a.data_dir, "t10k")
    model = make_model()
    names = [n for n, _ in model.named_parameters()]
    params = [t.detach().clone() for t in model.parameters()]
    velocity = [torch.zeros_like(t) for t in params]
    # The last len(probs) + 1 versions: weights, velocities and the rate they were made at.
    history = [([t.clone() for t in params], [t.clone() for t in velocity], 0.0)]
    batch, momentum, base_lr, warmup = 512, 0.9, 0.1, 100
    steps = math.ceil(len(train_x) / batch)
    max_iter = a.epochs * steps
    loss_fn = nn.CrossEntropyLoss()

    def rate(i):
        if i < warmup:
            return base_lr * (i + 1) / warmup
        return base_lr * 0.5 * (1 + math.cos(math.pi * min(i, max_iter) / max_iter))

    it = 0
    for _ in range(a.epochs):
        order = torch.randperm(len(train_x))
        for s in range(steps):
            total = [torch.zeros_like(t) for t in params]
            for chunk in order[s * batch:(s + 1) * batch].chunk(a.workers):
                tau = 0 if a.mode == "bsp" else random.choices(range(len(probs)), probs)[0]
                tau = min(tau, len(history) - 1)
                old_w, old_v, old_lr = history[-1 - tau]
                shift = old_lr * momentum * a.k if a.mode in ("look", "wlook") else 0.0
                at = [(w - shift * v).requires_grad_(True) for w, v in zip(old_w, old_v)]
                out = functional_call(model, dict(zip(names, at)), (train_x[chunk],))
                grads = torch.autograd.grad(loss_fn(out, train_y[chunk]), at)
                weight = len(chunk) / (1 + tau) if a.mode in ("weight", "wlook") else len(chunk)
                for k, g in enumerate(grads):
                    if a.mode == "dc" and tau > 0:
                        g = g + a.lam * g * g * (params[k] - old_w[k])
                    total[k] += g * weight
            lr = rate(it)
            for k in range(len(params)):
                g = total[k] / batch
                velocity[k].mul_(momentum).add_(g)
                params[k].sub_(lr * (g + momentum * velocity[k]))
            history.append(([t.clone() for t in params], [t.clone() for t in velocity], lr))
            history = history[-(len(probs) + 1):]
            it += 1
    with torch.no_grad():
        out = functional_call(model, dict(zip(names, params)), (test_x,))
        acc = (out.argmax(1) == test_y).float().mean().item()
    print(f"mode={a.mode} seed={a.seed} probs={a.probs} k={a.k} lam={a.lam} "
          f"test_accuracy={acc:.4f}")


if __name__ == "__main__":
    main()
