"""Which of probe's analyses run on which bridged architecture: each cell runs the analysis on a tiny fresh model
(``probe.bridge.model``) and reads "runs" or the one-line refusal it gave. Writes the table of docs/bridge.md.

Usage: ``python benchmarks/bridge_matrix.py [--write]`` (prints the table; ``--write`` replaces it in docs/bridge.md
between the markers). ``tests/test_bridge.py`` regenerates it and fails where the committed table disagrees.
"""

from __future__ import annotations

import contextlib
import io
import os
import sys
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from probe.bridge import BridgedModel  # noqa: E402
from probe.bridge import model as bridged  # noqa: E402
from probe.errors import ProbeError  # noqa: E402
from probe.tasks import make_task  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "bridge.md"
BEGIN, END = "<!-- bridge-matrix:begin -->", "<!-- bridge-matrix:end -->"
ARCHS = ["jamba", "qwen3-next", "falcon-h1", "nemotron-h", "lfm2", "bamba", "granitemoehybrid", "olmo-hybrid",
         "mamba2", "mamba", "falcon-mamba", "rwkv", "recurrentgemma", "nemotron-h + lstm"]
"""The rows: an architecture of ``probe.bridge.ARCHS``, or one with an nn.LSTM / nn.GRU in its recurrent layers'
place (``ARCH + lstm``: ``probe.bridge.boot(..., recurrent="lstm")``)."""
L = 6  # sequence length: every cell is a smoke run of the analysis on a tiny model, never a measurement


def _row(name: str) -> tuple[str, str]:
    """``(arch, recurrent)`` of a row of ``ARCHS``."""
    arch, _, cell = name.partition(" + ")
    return arch, cell or "native"


def _dat(arch: str, task: Any, recurrent: str = "native") -> None:
    """probe's trainer (``probe.training.train``) on ``arch`` as a ``BridgeModelConfig``, DAT switching at step 2 of
    4, float32 snapshots every 2 steps; then the attention parameters must be those of step 0 at the switch and have
    moved by step 4, and ``final.pt`` must rebuild (offline, ``torch.load(weights_only=True)``) to the same logits
    as the last snapshot."""
    from probe.bridge import BridgeModelConfig
    from probe.checkpoint import load_checkpoint
    from probe.training import build_configs, train

    _, _, cfg = build_configs("hybrid-dat", overrides=[
        "train.steps=4", "schedule.switch=2", "train.batch_size=4", "train.warmup=1", "train.eval_every=4",
        "train.eval_samples=4", "train.ckpt_every=4", "train.traj_every=2", "train.traj_dtype=float32"])
    model_cfg = BridgeModelConfig(arch=arch, d_model=32, n_layers=2, vocab_size=task.vocab_size, recurrent=recurrent)
    with tempfile.TemporaryDirectory() as out, contextlib.redirect_stderr(io.StringIO()):
        train(model_cfg, task, cfg, out, progress=False)
        snaps = [load_checkpoint(Path(out) / "trajectory" / f"step_{s:06d}.pt") for s in (0, 2, 4)]
        final = load_checkpoint(Path(out) / "final.pt")
        model = final.build_model()
    names = {n for n, p in model.named_parameters() if any(p is q for q in model.attention_parameters())}
    held = all(torch.equal(snaps[0].state_dict[n], snaps[1].state_dict[n]) for n in names)
    moved = any(not torch.equal(snaps[1].state_dict[n], snaps[2].state_dict[n]) for n in names)
    if not (names and held and moved):
        raise AssertionError(f"attention held while delayed: {held}, moved after the switch: {moved}")
    tokens = task.sample(L, 2, 0).tokens
    with torch.no_grad():
        again = snaps[2].build_model()
        if not torch.equal(model(tokens), again(tokens)):
            raise AssertionError("final.pt does not rebuild to the last snapshot's logits")


def _cells(task: Any) -> dict[str, Callable[[BridgedModel], Any]]:
    from probe.attributions.occlusion import resample_occlusion
    from probe.gradients import interference
    from probe.gradients.inputs import LookaheadConfig
    from probe.gradients.lookahead import measure_lookahead
    from probe.probes import interchange_intervention, probe_model
    from probe.probes.outputs import output_interchange
    from probe.sharpness.measure import sharpness_curve
    from probe.shortcuts.knockout import attention_knockout
    from probe.transitions import can_count
    from probe.windows import evaluate

    batch = task.sample(L, 4, 0)
    return {
        "gradient split": lambda m: interference(m, batch),
        "lookahead": lambda m: measure_lookahead(m, task, cfg=LookaheadConfig(
            n_batches=1, batch_size=4, eval_batches=1, train_eval_batches=1, lengths=(L,))),
        "probes": lambda m: probe_model(m, task, lengths=[L], n_train=8, n_train_beyond=4, n_test=4,
                                        patching=False),
        "interchange": lambda m: output_interchange(m, task, [L], n=4),
        "state probes": lambda m: probe_model(m, task, lengths=[L], hooks=m.state_sites(), n_train=8,
                                              n_train_beyond=4, n_test=4, patching=False),
        "state interchange": lambda m: (m.state_sites(edit=True), interchange_intervention(m, task, [L], n=4))[1],
        "occlusion": lambda m: resample_occlusion(m, batch, task),
        "shortcuts": lambda m: attention_knockout(m, task, lengths=[L], n_sequences=4),
        "sharpness": lambda m: sharpness_curve(m, task, [L], n_samples=4),
        "transitions": lambda m: can_count(m, task, length=L, n_samples=2),
        "evaluate": lambda m: evaluate(m, task, n_samples=4),
        "DAT training": lambda m: _dat(m.module.probe_arch, task, next(
            (c.kind for c in m.components if c.kind in ("lstm", "gru")), "native")),
    }


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()).replace("|", "/")


def cell(fn: Callable[[BridgedModel], Any], model: BridgedModel) -> str:
    """``runs``, or the refusal (a ProbeError's line), or ``error: ...`` (a bug this table shows rather than
    hides). A function that returns only not-applicable rows counts as a refusal with their reason."""
    try:
        out = fn(model)
    except ProbeError as e:
        return _one_line(e)
    except Exception as e:  # noqa: BLE001 -- the table reports what broke, by type, instead of stopping
        return f"error: {type(e).__name__}: {_one_line(e)[:160]}"
    frame = out[0] if isinstance(out, tuple) else out
    if hasattr(frame, "columns") and "applicable" in frame.columns and not frame["applicable"].any():
        return _one_line(ProbeError(str(frame["reason"].iloc[0])))
    return "runs"


def matrix(archs: list[str] = ARCHS) -> dict[str, dict[str, str]]:
    """``{arch: {analysis: cell}}``; an architecture that cannot be wrapped gets its refusal in every cell but
    evaluate's (the bridge itself still maps tokens to logits)."""
    from probe.bridge import boot
    from probe.windows import evaluate

    task = make_task("interleaved", train_length=L)
    cells = _cells(task)
    out = {}
    for name in archs:
        arch, recurrent = _row(name)
        torch.manual_seed(0)
        try:
            model = bridged(arch, task, recurrent=recurrent)
        except ProbeError as e:
            row = dict.fromkeys(cells, _one_line(e))
            row["evaluate"] = cell(lambda b: evaluate(b, task, n_samples=4), boot(arch, task, recurrent=recurrent))
            out[name] = row
            continue
        out[name] = {analysis: cell(fn, model) for analysis, fn in cells.items()}
    return out


def table(m: dict[str, dict[str, str]]) -> str:
    """The matrix as markdown: one row per architecture; each refusal written once below the table, cited by
    number, so the table stays readable."""
    analyses = list(next(iter(m.values())))
    notes: list[str] = []

    def ref(text: str) -> str:
        if text == "runs":
            return "runs"
        if text not in notes:
            notes.append(text)
        return f"[{notes.index(text) + 1}]"

    rows = [f"| architecture | {' | '.join(analyses)} |", f"|---|{'---|' * len(analyses)}"]
    rows += [f"| {arch} | {' | '.join(ref(r[a]) for a in analyses)} |" for arch, r in m.items()]
    return "\n".join([*rows, "", *(f"{i}. {n}" for i, n in enumerate(notes, 1))])


def main(argv: list[str]) -> int:
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    text = table(matrix())
    print(text)
    if "--write" in argv:
        doc = DOC.read_text()
        head, _, rest = doc.partition(BEGIN)
        _, _, tail = rest.partition(END)
        DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
