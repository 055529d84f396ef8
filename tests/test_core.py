"""The analysis core: gates, seeds, rows, lengths, chance, lazy exports, and that no analysis imports another's."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import pytest

from probe.core import chance as chance_mod
from probe.core import seeds
from probe.core.gates import attention_gates
from probe.core.lengths import multiples, parse_lengths, up_to
from probe.core.rows import CONTROL, INSTRUMENT, check_row, labelled, threshold_row
from probe.errors import ProbeError
from probe.tasks import make_task

PROBE = Path(__file__).resolve().parents[1] / "probe"
ANALYSES = ("gradients", "attributions", "probes", "shortcuts")


def test_gates_are_set_inside_and_restored_after_an_exception(hybrid):
    hybrid.set_attention_gate([0.25, 0.75])
    with attention_gates(hybrid, 0.0):
        assert hybrid.attention_gates() == [0.0, 0.0]
    assert hybrid.attention_gates() == [0.25, 0.75]
    with pytest.raises(RuntimeError), attention_gates(hybrid, [1.0, 0.0]):
        assert hybrid.attention_gates() == [1.0, 0.0]
        raise RuntimeError("analysis failed half-way")
    assert hybrid.attention_gates() == [0.25, 0.75]
    with attention_gates(hybrid, None):  # None: leave the gates as they are
        assert hybrid.attention_gates() == [0.25, 0.75]


def test_gates_leave_a_model_without_attention_alone(task):
    from conftest import tiny_model

    lstm = tiny_model("lstm", task.vocab_size)
    with attention_gates(lstm, 0.0):
        assert lstm.attention_gates() == []
    assert lstm.attention_gates() == []


def test_seed_registry_keeps_the_shipped_values_and_refuses_a_new_collision():
    shipped = {"evaluate": 7_000_000_000, "gradients": 8_000_000_000, "probes": 8_000_000_000,
               "attention": 8_100_000_000, "shortcut_window": 8_300_000_000, "shortcuts": 8_400_000_000,
               "shortcut_sums": 8_500_000_000, "shortcut_positional": 8_600_000_000, "lookahead": 9_000_000_000,
               "patching": 9_000_000_000}
    assert dict(seeds.bases()) == shipped
    # the two shared bases are the documented exceptions, and the only ones
    assert set(seeds.SHARED) == {"probes", "patching"}
    with pytest.raises(ProbeError, match="already used by 'evaluate'"):
        seeds.register("new_analysis", 7_000_000_000)
    with pytest.raises(ProbeError, match="already registered"):
        seeds.register("gradients", 1)
    assert seeds.seed_base("shortcuts") == 8_400_000_000
    with pytest.raises(ProbeError, match="no seed base"):
        seeds.seed_base("nope")


def test_no_module_outside_the_registry_defines_a_seed_base():
    """A new ``*_SEED_BASE = <number>`` would bypass the collision check."""
    offenders = []
    for path in PROBE.rglob("*.py"):
        if path.parent.name in ("core", "sweep") or path.name in ("train.py",):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                    and isinstance(node.value.value, int) and node.value.value >= 1_000_000_000
                    and any("SEED" in getattr(t, "id", "") for t in node.targets)):
                offenders.append(f"{path.relative_to(PROBE)}:{node.lineno}")
    assert offenders == []


def test_no_analysis_package_imports_another():
    for name in ANALYSES:
        for path in (PROBE / name).glob("*.py"):
            tree = ast.parse(path.read_text())
            modules = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
            modules += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
            others = [m for m in modules for o in ANALYSES if o != name and m.startswith(f"probe.{o}")]
            assert others == [], f"{path.relative_to(PROBE)} imports {others}"
    assert not (PROBE / "shortcuts" / "common.py").exists()


def test_rows_have_one_schema_with_a_kind():
    row = threshold_row("a.pt", "known_split", 1e-7, 1e-5, "what it catches")
    assert row == {"checkpoint": "a.pt", "control": "known_split", "kind": INSTRUMENT, "passed": True,
                   "value": 1e-7, "threshold": 1e-5, "what": "what it catches"}
    assert threshold_row("a.pt", "x", 2.0, 1.0, "", kind=CONTROL)["passed"] is False
    assert check_row("chance", CONTROL, True, subtask="state")["kind"] == CONTROL
    with pytest.raises(ValueError):
        check_row("x", "placebo", True)  # type: ignore[arg-type]
    rows = labelled([{"control": "same_sum"}, {"control": "permuted_target"}, {"control": "identity_patch"},
                     {"control": "x", "kind": CONTROL}],
                    {"same_sum": CONTROL, "identity": INSTRUMENT}, default=CONTROL)
    assert [r["kind"] for r in rows] == [CONTROL, CONTROL, INSTRUMENT, CONTROL]


def test_lengths_grammar_and_multiples():
    assert multiples(25) == [25, 50, 75, 100]
    assert multiples(25, (1, 3)) == [25, 75]
    assert up_to(3, 2) == [1, 2, 3, 4, 5, 6]
    assert parse_lengths("25,75") == [25, 75]
    assert parse_lengths("1:4") == [1, 2, 3, 4]
    assert parse_lengths("1:400:100") == [1, 101, 201, 301]
    # every length to 4x, then every 25 to 16x: ranges and single lengths mix, overlaps count once, sorted
    sixteen = parse_lengths("1:100,125:400:25")
    assert sixteen[:100] == list(range(1, 101)) and sixteen[100:] == list(range(125, 401, 25))
    assert parse_lengths("75,25,1:3,25") == [1, 2, 3, 25, 75]
    for bad in ("", "0", "5:1", "1:10:0", "a,b", "1:2:3:4", "-3", "1:100,0", "1:5,9:3"):
        with pytest.raises(ProbeError):
            parse_lengths(bad)


def test_chance_is_one_over_the_label_space():
    task = make_task("interleaved", train_length=8)
    assert chance_mod.chance(task, "state") == 1 / task.m
    # a recall answer is a value drawn uniformly from n_values, whatever the dictionary size
    assert chance_mod.chance(task, "recall") == 1 / task.n_values
    assert task.n_pairs != task.n_values


def test_lazy_package_exports_resolve_and_refuse_unknown_names():
    import probe.shortcuts as S

    assert callable(S.attention_knockout) and math.isfinite(S.FLAG_EFFECT)
    with pytest.raises(AttributeError):
        S.no_such_name  # noqa: B018
    assert "analyze" in dir(S)


def test_a_backward_pass_needs_more_memory_and_the_refusal_names_what_fits(monkeypatch, task):
    from probe.memory import check_lengths, forward_cost, max_positions
    from probe.models import ModelConfig

    cfg = ModelConfig(family="hybrid", vocab_size=task.vocab_size, d_model=16, n_layers=2, n_heads=2)
    assert forward_cost(cfg, 100, grad=True).total > forward_cost(cfg, 100).total
    budget = 2**26
    monkeypatch.setattr("probe.memory.available_bytes", lambda device="cpu": budget)
    longest = max_positions(cfg, budget / 2) - task.prefix_len
    check_lengths(cfg, task, [longest])  # fits without a backward pass
    with pytest.raises(ProbeError, match=r"^a\.pt: length \d+ needs about .* use lengths up to \d+$"):
        check_lengths(cfg, task, [longest], grad=True, name="a.pt")


def test_pipe_table_is_a_header_a_rule_and_one_line_per_row():
    from probe.core.tables import pipe_table

    assert pipe_table(["a", "b"], [[1, "x"], [2.5, None]]) == "| a | b |\n|---|---|\n| 1 | x |\n| 2.5 | None |"
    assert pipe_table(["only"], []) == "| only |\n|---|"


def test_a_disabled_progress_bar_draws_nothing_but_still_says_its_lines(capsys):
    from probe.core.progress import progress_bar, progress_iter

    bar = progress_bar(3, "runs", enabled=False)
    bar.update(1)
    bar.set_postfix_str("running 2")
    bar.set_description("runs")
    bar.write("FAILED a/seed0")
    bar.close()
    assert list(progress_iter([1, 2], "x", enabled=False)) == [1, 2]
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == "FAILED a/seed0\n"


def test_every_progress_bar_and_markdown_table_comes_from_one_helper():
    """A bar drawn by its own tqdm ignores --json and --no-progress; a table written by hand drifts from the others."""
    bars, tables = [], []
    for path in PROBE.rglob("*.py"):
        name = path.relative_to(PROBE).as_posix()
        text = path.read_text()
        if "tqdm(" in text and name != "core/progress.py":
            bars.append(name)
        if "|---" in text and name != "core/tables.py":
            tables.append(name)
    assert bars == [], "use probe.core.progress.progress_iter / progress_bar"
    assert tables == [], "use probe.core.tables.pipe_table"


def test_a_control_line_carries_its_value_threshold_and_meaning():
    from probe.core.rows import control_line

    row = {"control": "permuted_target", "kind": "control", "passed": False, "hook": "rnn.layers.0.hook_h",
           "train_positions": "in", "value": 0.012, "threshold": 0.05, "passes_if": ">=",
           "what": "a fail means no s_t-specific decoding beyond L_train"}
    line = control_line(row)
    assert line.startswith("  FAIL control permuted_target hook=rnn.layers.0.hook_h train_positions=in")
    assert "value 0.012 (passes if >= 0.05)" in line and line.endswith("no s_t-specific decoding beyond L_train")
    assert "\n" not in line
