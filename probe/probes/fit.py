"""Activations at the state positions of a hook (or of several hooks joined), and the linear probes fit on them."""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler
from threadpoolctl import threadpool_limits

from probe.core.inputs import check_inputs
from probe.core.seeds import PROBES
from probe.errors import ProbeError
from probe.models import HookedSequenceModel
from probe.models.recurrent import HookedRecurrent
from probe.probes.targets import control_labels
from probe.tasks import TaskConfig
from probe.wrapped import WrappedModel

PROBE_SEED_BASE = PROBES
"""Probe data: the ``probes`` entry of ``probe.core.seeds`` (it shares its value with ``gradients``; see there)."""

HOOK_SUFFIXES = ("hook_attn_out", "hook_resid_post")
"""Default single hooks after each block's recurrent state (``state_names``), in every block where they exist."""

JOIN = "+"
"""``a+b`` names one probe on the concatenation of hooks a and b."""

BANDS = ("in", "beyond", "all")
"""Position bands: ``in`` = t <= L_train, ``beyond`` = t > L_train, ``all``."""

MAX_ITER = 500


def band_mask(position: np.ndarray, train_length: int, band: str) -> np.ndarray:
    if band == "in":
        return position <= train_length
    if band == "beyond":
        return position > train_length
    return np.ones(position.shape, dtype=bool)


def lstm_blocks(model: HookedSequenceModel | WrappedModel) -> list[int]:
    """The blocks with a recurrent sublayer (``blocks.{i}.lstm``, any cell). A wrapped model has no blocks: its
    "blocks" here are its hooked cells (each layer of a named ``nn.LSTM`` / ``nn.GRU``, ``WrappedModel.hooked_cells``),
    numbered in order; a recurrent module with module-level hooks only has no per-step state to read or set."""
    if isinstance(model, WrappedModel):
        return list(range(len(model.hooked_cells)))
    return [i for i, b in enumerate(model.blocks) if hasattr(b, "lstm")]


def recurrent_cell(model: HookedSequenceModel | WrappedModel, block: int) -> HookedRecurrent:
    """Block ``block``'s recurrent sublayer (``lstm_blocks`` numbering), the cell whose ``override_state`` the
    interventions use."""
    if isinstance(model, WrappedModel):
        return list(model.hooked_cells.values())[block]
    return model.blocks[block].lstm


def cell_paths(model: HookedSequenceModel | WrappedModel) -> list[str]:
    """A wrapped model's hooked cells' paths in ``lstm_blocks`` order (``lstm.layers.0``); none for probe's own."""
    return list(model.hooked_cells) if isinstance(model, WrappedModel) else []


def state_names(model: HookedSequenceModel | WrappedModel, block: int) -> list[str]:
    """The hooks of the recurrent state of block ``block``: one per name in its cell's ``STATES``, the output h
    first, then what the recurrence carries besides it (the LSTM's c, the SSM's ``state``; the GRU carries h
    alone). This is "the state" everywhere in the probes: the vectors probed as the state, and the ones the
    interventions read and set with ``override_state`` (which takes them in this order). A wrapped model's:
    ``{cell path}.hook_h`` (``lstm.layers.0.hook_h``), ``hook_c``."""
    prefix = f"{cell_paths(model)[block]}." if isinstance(model, WrappedModel) else f"blocks.{block}.lstm."
    return [f"{prefix}hook_{s}" for s in recurrent_cell(model, block).STATES]


def state_hook(model: HookedSequenceModel, blocks: Sequence[int]) -> str:
    """The joined hook of the recurrent state of ``blocks`` (each block's ``state_names`` in turn: h_i, c_i for the
    LSTM): the space that the subspace interventions edit."""
    return JOIN.join(n for i in blocks for n in state_names(model, i))


def slot_block(hook: str, cells: Sequence[str] = ()) -> int | None:
    """The block whose recurrent sublayer every part of ``hook`` belongs to, or None (another sublayer, or parts
    from several blocks). ``cells``: a wrapped model's ``cell_paths``, whose k-th cell is block k."""
    def block_of(p: str) -> str | None:
        if p.startswith("blocks.") and ".lstm.hook_" in p:
            return p.split(".")[1]
        return next((str(k) for k, c in enumerate(cells) if p.startswith(f"{c}.hook_")), None)

    found = {block_of(p) for p in parts(hook)}
    block = found.pop() if len(found) == 1 else None
    return None if block is None else int(block)


def is_state_hook(hook: str, cells: Sequence[str] = ()) -> bool:
    """Whether some part of ``hook`` is a recurrent state (``slot_block`` finds its block)."""
    return any(slot_block(p, cells) is not None for p in parts(hook))


def default_hooks(model: HookedSequenceModel) -> list[str]:
    """Every block's recurrent state (``state_names``), attention output and residual stream that exist; then the
    joined hooks: each recurrent block's whole state (h, c for the LSTM), and with several blocks every block's
    h, and every block's whole state. A joined hook that names one vector only (a GRU's state is h) is not
    repeated. A wrapped model: ``WrappedModel.probe_hooks`` (per-step states, each named module's output)."""
    if isinstance(model, WrappedModel):
        return model.probe_hooks()
    names = set(model.hook_dict)
    blocks = lstm_blocks(model)
    single = [n for i in range(len(model.blocks))
              for n in [*(state_names(model, i) if i in blocks else []),
                        *(f"blocks.{i}.{s}" for s in HOOK_SUFFIXES)] if n in names]
    joined = [state_hook(model, [i]) for i in blocks]
    if len(blocks) > 1:
        joined += [JOIN.join(f"blocks.{i}.lstm.hook_h" for i in blocks), state_hook(model, blocks)]
    return list(dict.fromkeys(single + [h for h in joined if JOIN in h]))


def parts(hook: str) -> list[str]:
    return hook.split(JOIN)


def resolve_hooks(model: HookedSequenceModel, specs: Sequence[str] | None) -> list[str]:
    """Hook names from exact names or suffixes (``lstm.hook_h`` = that hook in every block, one probe each).

    A spec with ``+`` is one probe on the concatenation of everything its parts name, in that order
    (``lstm.hook_h+lstm.hook_c`` = every block's h, then every block's c)."""
    if not specs:
        return default_hooks(model)
    # every hook with one vector per position; (head, query, key) patterns are not per-position features
    names = [n for n in model.hook_dict if not n.endswith(("hook_attn_scores", "hook_pattern"))]

    def match(spec: str) -> list[str]:
        hits = [n for n in names if n == spec or n.endswith("." + spec)]
        if not hits:
            raise ProbeError(f"no per-position hook matches {spec!r}; try one of {', '.join(default_hooks(model))}")
        return hits

    out: list[str] = []
    for spec in specs:
        if JOIN in spec:
            joined = JOIN.join(dict.fromkeys(h for p in parts(spec) for h in match(p)))
            hits = [joined]
        else:
            hits = match(spec)
        out.extend(h for h in hits if h not in out)
    return out


@dataclass
class Activations:
    """Features at state positions. ``features[hook]`` is ``(N, d)`` for each single hook; ``labels`` s_t;
    ``control`` the control target; ``position`` the 1-based stream position; ``length`` the stream length;
    ``targets[name]`` further control targets (``targets.control_labels`` names, e.g. ``window3``)."""

    features: dict[str, np.ndarray]
    labels: np.ndarray
    control: np.ndarray
    position: np.ndarray
    length: np.ndarray
    targets: dict[str, np.ndarray] = field(default_factory=dict)

    def x(self, hook: str) -> np.ndarray:
        """Features of a single or joined hook."""
        ps = parts(hook)
        return self.features[ps[0]] if len(ps) == 1 else np.concatenate([self.features[p] for p in ps], axis=1)

    def select(self, mask: np.ndarray) -> Activations:
        return Activations({k: v[mask] for k, v in self.features.items()}, self.labels[mask], self.control[mask],
                           self.position[mask], self.length[mask], {k: v[mask] for k, v in self.targets.items()})

    @staticmethod
    def concat(items: Sequence[Activations]) -> Activations:
        return Activations({k: np.concatenate([a.features[k] for a in items]) for k in items[0].features},
                           *(np.concatenate([getattr(a, f) for a in items])
                             for f in ("labels", "control", "position", "length")),
                           {k: np.concatenate([a.targets[k] for a in items]) for k in items[0].targets})


@torch.no_grad()
def collect_activations(model: HookedSequenceModel, task: TaskConfig, lengths: Iterable[int], n_per_length: int,
                        hooks: Sequence[str], seed: int, control: str = "permuted",
                        control_seed: int = 0, targets: Sequence[str] = ()) -> Activations:
    """Run ``n_per_length`` sequences of each length through ``model`` and keep the hooks at state positions;
    ``targets``: further control targets to label them with (``targets.control_labels`` names)."""
    check_inputs("probe.probes.collect_activations", model=model, task=task)
    device = next(model.parameters()).device
    single = list(dict.fromkeys(p for h in hooks for p in parts(h)))
    feats: dict[str, list[np.ndarray]] = {h: [] for h in single}
    labels, ctrl_labels, position, length_col = [], [], [], []
    extra: dict[str, list[np.ndarray]] = {name: [] for name in targets}
    for length in lengths:
        batch = task.sample(length, n_per_length, seed + length)
        state = batch.masks["state"]
        if not state.any():
            continue
        _, cache = model.run_with_cache(batch.tokens.to(device), names_filter=single)
        for h in single:
            feats[h].append(cache[h][state.to(device)].flatten(1).float().cpu().numpy())  # q/k/v/z: heads joined
        labels.append(batch.sums[state].numpy())
        ctrl_labels.append(control_labels(batch.tokens, state, task.m, control_seed, control)[state].numpy())
        for name, values in extra.items():
            values.append(control_labels(batch.tokens, state, task.m, control_seed, name)[state].numpy())
        pos = torch.arange(1, batch.tokens.shape[1] + 1) - batch.prefix_len
        position.append(pos.expand_as(state)[state].numpy())
        length_col.append(np.full(int(state.sum()), length))
    if not labels:
        raise ProbeError(f"task {task.name} asks no state questions: nothing to probe")
    return Activations({h: np.concatenate(v) for h, v in feats.items()}, np.concatenate(labels),
                       np.concatenate(ctrl_labels), np.concatenate(position), np.concatenate(length_col),
                       {name: np.concatenate(v) for name, v in extra.items()})


def fit_probe(x: np.ndarray, y: np.ndarray, seed: int = 0, max_iter: int = MAX_ITER) -> Pipeline:
    """Standardised multinomial logistic regression (lbfgs). ``n_iter_ < max_iter`` tells that it converged."""
    probe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=max_iter, random_state=seed))
    # One BLAS thread: these problems are small, and threaded BLAS spin-waits cost several times the work itself.
    with warnings.catch_warnings(), threadpool_limits(limits=1):
        warnings.simplefilter("ignore", ConvergenceWarning)  # reported as the `converged` column instead
        probe.fit(x, y)
    return probe


def converged(probe: Pipeline, max_iter: int = MAX_ITER) -> bool:
    return int(probe[-1].n_iter_.max()) < max_iter


def readout_basis(probe: Pipeline, tol: float = 1e-6) -> np.ndarray:
    """Orthonormal basis ``(d, r)`` of the directions a fitted probe reads, in the raw feature space.

    The probe's logits are ``W ((x - mu) / sigma) + b``, i.e. ``(W / sigma) x`` + const, so it reads exactly the row
    space of ``W / sigma``; replacing that component of x with another input's makes the probe's logits (and
    prediction) those of the other input, and leaves everything the probe does not read unchanged. Rank <= m - 1:
    the softmax ignores a shift common to every class, and the L2-penalised rows sum to zero.
    """
    scaler, lr = probe[0], probe[-1]
    w = lr.coef_ / scaler.scale_[None, :]
    u, s, vt = np.linalg.svd(w, full_matrices=False)
    return vt[s > tol * s.max()].T


def random_init_like(model: HookedSequenceModel, seed: int) -> HookedSequenceModel:
    """The same architecture (gates included) with seeded random weights: the random-init control."""
    if isinstance(model, WrappedModel):
        return model.random_init(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        other = HookedSequenceModel(model.cfg)
    if other.attention_blocks:
        other.set_attention_gate(model.attention_gates())
    return other.to(next(model.parameters()).device).eval()
