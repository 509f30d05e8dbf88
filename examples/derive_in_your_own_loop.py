"""derive() from your own training loop: no Hugging Face, only the pieces leadline measures with.

The task is a least-squares fit (y = x W_true^T plus noise) so the script runs in seconds on a
CPU; a row is one (x, y) pair and each row scores one "token". leadline measures the gradient
noise scale, the memory/throughput ramp, the first safe step and the rate on these pieces, then
the script trains with the plan, and with AdamW at 1e-3 for the same steps, from the same start,
and reads the held-out rows after each.

    python examples/derive_in_your_own_loop.py

It runs the full effort, derive()'s: the rate comes from the look-ahead, the real optimizer run
ahead from the same weights at several rates and compared on the held-out rows.
"""

from __future__ import annotations

import argparse

import torch

from leadline.lookahead.derive import derive
from leadline.lookahead.pieces import Corpus, Pieces
from leadline.memory import TrainingStep


def main(argv: list[str] | None = None) -> dict[str, float]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=120, help="the run's length in optimizer steps")
    args = ap.parse_args(argv)

    torch.manual_seed(0)
    dim, rows, held_rows = 16, 4096, 256
    true = torch.randn(4, dim)
    xs = torch.randn(rows + held_rows, dim)
    ys = xs @ true.T + 0.3 * torch.randn(rows + held_rows, 4)
    train_x, train_y, held_x, held_y = xs[:rows], ys[:rows], xs[rows:], ys[rows:]

    model = torch.nn.Linear(dim, 4, bias=False)
    params = [model.weight]
    optimizer = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.0)

    def batch(start: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        i = torch.arange(start, start + n) % rows
        return train_x[i], train_y[i]

    def loss_on(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ((model(x) - y) ** 2).mean()

    def gradients(i: int) -> tuple[list[torch.Tensor], int]:
        """Micro-batch i's gradient of the mean loss, and the rows ("scored tokens") it read."""
        x, y = batch(8 * i, 8)
        return list(torch.autograd.grad(loss_on(x, y), params)), 8

    def loss_of(n_rows: int, length: int) -> torch.Tensor:
        """The real training step's loss at a shape (the memory ramp times it)."""
        return loss_on(*batch(0, n_rows))

    def train_step_of(micro_batch: int, grad_accum: int):
        """``step(t)``: step t's forward and backward over grad_accum micro-batches (the optimizer
        step is leadline's)."""
        def step(t: int) -> float:
            total = 0.0
            for k in range(grad_accum):
                loss = loss_on(*batch((t * grad_accum + k) * micro_batch, micro_batch)) / grad_accum
                loss.backward()
                total += float(loss.detach())
            return total
        return step

    def held_out_losses() -> list[float]:
        with torch.no_grad():
            return [float(v) for v in ((model(held_x) - held_y) ** 2).mean(dim=1)]

    before = sum(held_out_losses()) / held_rows
    plan = derive(
        Corpus(seq_len=1),  # no text: a row is one (x, y) pair, its "length" 1
        Pieces(step=TrainingStep(loss_of, optimizer), gradients=gradients, weights=[("weight", model.weight)],
               trained_as="weights", optimizer=optimizer, train_step_of=train_step_of,
               held_out_losses=held_out_losses),
        effort="full", total_steps=args.steps,
    )
    for name in ("micro_batch", "grad_accum", "tokens_per_step", "lr", "warmup_steps", "total_steps"):
        if name in plan:
            v = plan[name]
            shown = f"{v.value:.3g}" if isinstance(v.value, float) else str(v.value)
            print(f"{name:16} {shown:>10}  {v.kind:9} {v.source[:80]}")

    start = model.weight.detach().clone()  # derive left the weights as it found them

    def train(lr: float, micro_batch: int, grad_accum: int, steps: int) -> float:
        """A plain loop at a constant rate (`leadline.lookahead.rate.LookaheadSchedule` would run the
        plan's schedule); the held-out loss after it."""
        with torch.no_grad():
            model.weight.copy_(start)
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
        step = train_step_of(micro_batch, grad_accum)
        for t in range(steps):
            step(t)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return sum(held_out_losses()) / held_rows

    after = train(float(plan.lr), int(plan.micro_batch), int(plan.grad_accum), int(plan.total_steps))
    recipe = train(1e-3, 16, 1, int(plan.total_steps))  # a common default: AdamW 1e-3, 16 rows a step
    print(f"held-out loss before training {before:.4f}; after {int(plan.total_steps)} steps: the plan "
          f"(lr {plan.lr:.3g}) {after:.4f}, AdamW 1e-3 at 16 rows a step {recipe:.4f}")
    return {"before": before, "after": after, "recipe": recipe, "lr": float(plan.lr)}


if __name__ == "__main__":
    main()
