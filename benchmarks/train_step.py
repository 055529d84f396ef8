"""Step time of probe's trainer vs a plain-PyTorch training loop of the same model, side by side.

Usage: ``python benchmarks/train_step.py [--steps 40] [--preset hybrid-joint]``. Both loops draw the same batches,
run AdamW with the same settings and clip gradients; the plain loop uses the HookPoint-free twin of the model.
Steps are interleaved (trainer step, plain step, ...) so that machine noise hits both alike; medians are printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).parent))
from plain_twin import plain_forward  # noqa: E402

from probe.models import HookedSequenceModel  # noqa: E402
from probe.tasks import IGNORE_INDEX  # noqa: E402
from probe.train import Trainer, build_configs, lr_at, train_batch_seed  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--preset", default="hybrid-joint")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model_cfg, task, cfg = build_configs(args.preset)
    trainer = Trainer(model_cfg, task, cfg, tempfile.mkdtemp(), progress=False)
    torch.manual_seed(cfg.seed)
    plain = HookedSequenceModel(model_cfg)  # used only through plain_forward: its HookPoints never run
    plain.load_state_dict(trainer.model.state_dict())
    opt = torch.optim.AdamW(plain.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)

    def plain_step(step: int) -> None:
        g = torch.Generator().manual_seed(train_batch_seed(cfg.seed, step))
        length = int(torch.randint(1, task.train_length + 1, (1,), generator=g))
        batch = task.sample(length, cfg.batch_size, g)
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step)
        logits = plain_forward(plain, batch.tokens)
        loss = F.cross_entropy(logits.flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE_INDEX)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), cfg.grad_clip)
        opt.step()
        loss.item()

    times: dict[str, list[float]] = {"trainer": [], "plain": []}
    for step in range(args.steps):
        for name in (("trainer", "plain") if step % 2 == 0 else ("plain", "trainer")):
            t0 = time.perf_counter()
            trainer.train_step(step) if name == "trainer" else plain_step(step)
            if step >= 3:  # the first steps allocate Adam state
                times[name].append(time.perf_counter() - t0)
    t, p = statistics.median(times["trainer"]), statistics.median(times["plain"])
    print(f"preset {args.preset}: {args.steps} interleaved steps (first 3 dropped), {args.threads} thread(s)")
    print(f"  probe trainer step: {1000 * t:8.2f} ms median")
    print(f"  plain PyTorch step: {1000 * p:8.2f} ms median")
    print(f"  ratio trainer / plain: {t / p:.3f}x (target <= 1.05x)")


if __name__ == "__main__":
    main()
