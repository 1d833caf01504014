#!/usr/bin/env python3
"""The default job's model and settings in a plain PyTorch loop: the reference the job is
measured against (scripts/speed_compare.sh, README "Speed and scaling").

    python3 scripts/pytorch_mlp.py [--epochs 15] [--threads 1] [--run_dir DIR]
        [--device cpu|cuda] [--layers 784,256,128,10] [--model mlp|cnn]

The same MLP (784-256-128-10, ReLU, He-normal weights, zero biases, softmax cross-entropy),
the same data (Debian's dataset-fashion-mnist, pixels / 255, shuffled each epoch by --seed)
and the same schedule as configs/fashion_mnist_mlp.flags: batch 512, Nesterov momentum 0.9,
lr 0.1 warmed up linearly over 100 steps, then a cosine that ends at --max_iter (default:
the whole run, epochs x ceil(60000 / 512)). Prints one line per epoch (test accuracy) and a
last line with examples/s over the training steps, the seconds to reach --target test
accuracy, and the final accuracy; with --run_dir writes the same as summary.json there.
Needs python3-torch (`apt-get install -y python3-torch`).

The GPU check (scripts/gpu_check.sh) runs it on the same GPU as the job: --device cuda keeps
the data and model there; --layers sets another MLP (the wide 784,4096,4096,10); --model
cnn is configs/fashion_mnist_cnn.flags' network (conv 3x3 16 and 32 with ReLU and 2x2
max-pool, dense 128, dense 10; there: batch 64, momentum 0.9 without Nesterov
(--no_nesterov), lr 0.03, no warmup).
"""
import argparse
import gzip
import json
import math
import os
import sys
import time

import torch
from torch import nn


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    dims = data[3]
    shape = [int.from_bytes(data[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    return torch.frombuffer(bytearray(data[4 + 4 * dims:]), dtype=torch.uint8).reshape(shape)


def load(data_dir, split):
    def find(stem):
        for name in (stem, stem + ".gz"):
            if os.path.exists(os.path.join(data_dir, name)):
                return os.path.join(data_dir, name)
        sys.exit(f"pytorch_mlp.py: no {stem}[.gz] in {data_dir}: "
                 "apt-get install -y dataset-fashion-mnist")
    images = read_idx(find(f"{split}-images-idx3-ubyte"))
    labels = read_idx(find(f"{split}-labels-idx1-ubyte"))
    return images.reshape(len(images), -1).float() / 255.0, labels.long()


def make_model(layers=(784, 256, 128, 10), kind="mlp"):
    """The job's MLP (or CNN), initialized as its servers do: He-normal weights, zero biases."""
    if kind == "cnn":
        model = nn.Sequential(nn.Unflatten(1, (1, 28, 28)),
                              nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                              nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(),
                              nn.Linear(128, 10))
    else:
        mods = []
        for i in range(len(layers) - 1):
            mods.append(nn.Linear(layers[i], layers[i + 1]))
            if i + 2 < len(layers):
                mods.append(nn.ReLU())
        model = nn.Sequential(*mods)
    for m in model:
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            nn.init.zeros_(m.bias)
    return model


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data_dir", default="/usr/share/datasets/fashion-mnist")
    p.add_argument("--epochs", type=int, default=15)
    p.add_argument("--batch_size", type=int, default=512)
    p.add_argument("--base_lr", type=float, default=0.1)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--warmup_iters", type=int, default=100)
    p.add_argument("--max_iter", type=int, default=0, help="0: the whole run")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    p.add_argument("--target", type=float, default=0.88)
    p.add_argument("--run_dir", default="")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--layers", default="784,256,128,10", help="--model mlp: the widths")
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    p.add_argument("--no_nesterov", action="store_true", help="plain momentum")
    a = p.parse_args()
    if a.epochs < 1 or a.batch_size < 1 or a.threads < 1:
        sys.exit("pytorch_mlp.py: --epochs, --batch_size and --threads must be >= 1")

    start = time.time()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    if a.device not in ("cpu", "cuda") or (a.device == "cuda" and not torch.cuda.is_available()):
        sys.exit(f"pytorch_mlp.py: --device={a.device}: expected cpu, or cuda on a machine with one")
    try:
        layers = [int(x) for x in a.layers.split(",")]
    except ValueError:
        layers = []
    if len(layers) < 2 or min(layers) < 1 or layers[0] != 784 or layers[-1] != 10:
        sys.exit(f"pytorch_mlp.py: --layers={a.layers}: expected widths 784,...,10")
    dev = torch.device(a.device)
    train_x, train_y = load(a.data_dir, "train")
    test_x, test_y = load(a.data_dir, "t10k")
    train_x, train_y, test_x, test_y = (t.to(dev) for t in (train_x, train_y, test_x, test_y))
    steps_per_epoch = math.ceil(len(train_x) / a.batch_size)
    max_iter = a.max_iter or a.epochs * steps_per_epoch

    model = make_model(layers, a.model).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=a.base_lr, momentum=a.momentum,
                          nesterov=not a.no_nesterov)

    def rate(it):  # common/lr_policy.cc: cosine, then the linear warmup factor
        lr = a.base_lr * 0.5 * (1 + math.cos(math.pi * min(it, max_iter) / max_iter))
        return lr * (it + 1) / a.warmup_iters if it < a.warmup_iters else lr

    loss_fn = nn.CrossEntropyLoss()
    train_seconds, examples, step, to_target, acc = 0.0, 0, 0, None, 0.0
    train_start = time.time()
    for epoch in range(1, a.epochs + 1):
        t0 = time.time()
        model.train()
        order = torch.randperm(len(train_x)).to(dev)
        for b in range(steps_per_epoch):
            idx = order[b * a.batch_size:(b + 1) * a.batch_size]
            for g in opt.param_groups:
                g["lr"] = rate(step)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(train_x[idx]), train_y[idx])
            loss.backward()
            opt.step()
            step += 1
            examples += len(idx)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        train_seconds += time.time() - t0
        model.eval()
        with torch.no_grad():
            acc = (model(test_x).argmax(1) == test_y).float().mean().item()
        if to_target is None and acc >= a.target:
            to_target = time.time() - train_start
        print(f"epoch {epoch}: loss {loss.item():.4f} test accuracy {acc:.4f}", flush=True)

    summary = {
        "examples_per_sec": examples / train_seconds,
        "seconds_to_target": to_target,
        "target": a.target,
        "test_accuracy": acc,
        "wall_seconds": time.time() - start,
        "threads": a.threads,
        "device": a.device,
        "model": a.model if a.model == "cnn" else "mlp " + a.layers,
        "batch_size": a.batch_size,
    }
    print(f"pytorch: {summary['examples_per_sec']:.0f} examples/s, "
          f"to {a.target}: {'%.1f s' % to_target if to_target else '-'}, "
          f"final test accuracy {acc:.4f}, wall {summary['wall_seconds']:.1f} s")
    if a.run_dir:
        os.makedirs(a.run_dir, exist_ok=True)
        with open(os.path.join(a.run_dir, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
