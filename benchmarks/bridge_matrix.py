"""Which of probe's analyses run on which bridged architecture: each cell runs the analysis on a tiny fresh model
(``probe.bridge.model``) and reads "runs" or the one-line refusal it gave. Writes the table of docs/bridge.md.

Usage: ``python benchmarks/bridge_matrix.py [--write]`` (prints the table; ``--write`` replaces it in docs/bridge.md
between the markers). ``tests/test_bridge.py`` regenerates it and fails where the committed table disagrees.
"""

from __future__ import annotations

import os
import sys
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
ARCHS = ["jamba", "qwen3-next", "falcon-h1", "nemotron-h", "lfm2", "bamba", "olmo-hybrid", "mamba2", "mamba",
         "falcon-mamba", "rwkv", "recurrentgemma"]
L = 6  # sequence length: every cell is a smoke run of the analysis on a tiny model, never a measurement


def _dat(model: BridgedModel, task: Any) -> None:
    """What probe's trainer asks of a model under DAT, for 2 + 2 steps: gate 0 and attention held out of the
    optimizer, then gate 1 with every parameter; the attention parameters must not move in phase 1."""
    if not model.attention_names:
        raise ProbeError(f"{model.cfg.family}: no attention component, so there is no attention to delay")
    att = {id(p) for p in model.attention_parameters()}
    rest = [p for p in model.parameters() if id(p) not in att]
    before = [p.detach().clone() for p in model.attention_parameters()]
    for phase, (gate, params) in enumerate([(0.0, rest), (1.0, list(model.parameters()))]):
        model.set_attention_gate(gate)
        opt = torch.optim.AdamW(params, lr=1e-3)
        for step in range(2):
            batch = task.sample(L, 4, 10 * phase + step)
            opt.zero_grad()
            model(batch.tokens, batch.labels, return_type="loss").backward()
            opt.step()
        if phase == 0 and any(not torch.equal(b, p) for b, p in zip(before, model.attention_parameters(),
                                                                        strict=True)):
            raise AssertionError("attention moved while delayed")


def _cells(task: Any) -> dict[str, Callable[[BridgedModel], Any]]:
    from probe.attributions.occlusion import resample_occlusion
    from probe.evaluate import accuracy_at_length
    from probe.gradients import interference
    from probe.gradients.inputs import LookaheadConfig
    from probe.gradients.lookahead import measure_lookahead
    from probe.probes import probe_model
    from probe.probes.outputs import output_interchange
    from probe.sharpness.measure import sharpness_curve
    from probe.shortcuts.knockout import attention_knockout
    from probe.transitions import can_count

    batch = task.sample(L, 4, 0)
    return {
        "gradient split": lambda m: interference(m, batch),
        "lookahead": lambda m: measure_lookahead(m, task, cfg=LookaheadConfig(
            n_batches=1, batch_size=4, eval_batches=1, train_eval_batches=1, lengths=(L,))),
        "probes": lambda m: probe_model(m, task, lengths=[L], n_train=8, n_train_beyond=4, n_test=4,
                                        patching=False),
        "interchange": lambda m: output_interchange(m, task, [L], n=4),
        "occlusion": lambda m: resample_occlusion(m, batch, task),
        "shortcuts": lambda m: attention_knockout(m, task, lengths=[L], n_sequences=4),
        "sharpness": lambda m: sharpness_curve(m, task, [L], n_samples=4),
        "transitions": lambda m: can_count(m, task, length=L, n_samples=2),
        "evaluate": lambda m: accuracy_at_length(m, task, L, n_samples=4),
        "DAT training": lambda m: _dat(m, task),
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
    from probe.evaluate import accuracy_at_length

    task = make_task("interleaved", train_length=L)
    cells = _cells(task)
    out = {}
    for arch in archs:
        torch.manual_seed(0)
        try:
            model = bridged(arch, task)
        except ProbeError as e:
            row = dict.fromkeys(cells, _one_line(e))
            row["evaluate"] = cell(lambda b: accuracy_at_length(b, task, L, n_samples=4), boot(arch, task))
            out[arch] = row
            continue
        out[arch] = {name: cell(fn, model) for name, fn in cells.items()}
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
