"""A plain PyTorch training loop fed by tandem: the C++ loader reads IDX files (MNIST's format)
with worker threads, tandem.augment crops, rotates, blurs and normalizes on the batch's device,
and everything else is ordinary PyTorch.

    python plain_loop.py IMAGES.idx[.gz] LABELS.idx[.gz] [--device cuda] [--epochs 2]
                         [--batch-size 64] [--max-steps N]
"""
import argparse

import torch
import torch.nn as nn

import tandem

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("images")
ap.add_argument("labels")
ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
ap.add_argument("--epochs", type=int, default=2)
ap.add_argument("--batch-size", type=int, default=64)
ap.add_argument("--max-steps", type=int, default=0, help="steps per epoch at most (0: all)")
a = ap.parse_args()

data = tandem.data.Idx(a.images, a.labels)
loader = tandem.data.Loader(data, a.batch_size, workers=2, shuffle=True, device=a.device)
spec = tandem.AugmentSpec(crop=(24, 24), out=(28, 28), max_rotation_deg=10, blur_kernel=3,
                          mean=(33.3,), std=(78.6,), hflip_probability=0.0)
model = nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                      nn.Linear(16 * 14 * 14, 10)).to(a.device)
opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
for epoch in range(a.epochs):
    total, correct, loss_sum = 0, 0, 0.0
    for step, batch in enumerate(loader):
        if a.max_steps and step == a.max_steps:
            break
        x = tandem.augment(batch["image"], spec)          # (B, 1, 28, 28) float32
        y = batch["label"].to(a.device)
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_sum += loss.item() * len(y)
        correct += (logits.argmax(1) == y).sum().item()
        total += len(y)
    print(f"epoch {epoch + 1}: loss {loss_sum / total:.4f}, train accuracy {100 * correct / total:.1f}%")
