"""One grammar for every analysis CLI: the shared flags, one-line errors with exit 2, one ``--out`` layout, and a
start that does not import the models before it has work to do."""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from probe.checkpoint import checkpoint_from_model, save_checkpoint
from probe.cli import nonnegative_int, positive_float, positive_int
from probe.tasks import make_task

from conftest import tiny_model

ROOT = Path(__file__).resolve().parents[1]
ANALYSES = {"evaluate": "probe.evaluate", "gradients": "probe.gradients.cli",
            "attributions": "probe.attributions.cli", "probes": "probe.probes.cli", "shortcuts": "probe.shortcuts.cli",
            "sharpness": "probe.sharpness.cli"}
CLIS = dict(ANALYSES)
SHARED = ("--lengths", "--samples", "--threads", "--out", "--json", "--device", "--seed", "--no-progress")
EVERY_CLI = {**CLIS, "transitions": "probe.transitions", "retrain": "probe.retrain", "train": "probe.training.cli",
             "sweep": "probe.sweep.cli", "results": "probe.results.__main__"}
"""Every ``python -m probe.NAME`` command (each built on probe.runner: tests/test_runner.py finds them from the
files)."""
OLD_SPELLINGS = {"gradients": ["--length", "--batch"], "attributions": ["--length", "--batch"],
                 "probes": ["--n-test"], "shortcuts": ["--sequences"]}
SMALL = {  # tiny sizes: the layout is what is checked here, not the numbers
    "evaluate": ["--lengths", "4,8", "--samples", "4"],
    "gradients": ["--lengths", "4", "--samples", "4", "--no-lookahead"],
    "attributions": ["--lengths", "4", "--samples", "2"],
    "probes": ["--lengths", "8", "--samples", "4", "--n-train", "12", "--n-train-beyond", "4", "--n-patch", "4"],
    "shortcuts": ["--lengths", "4", "--samples", "4", "--runs", "4", "--window-samples", "8", "--entropy-lengths",
                  "4", "--sum-ks", "3"],
    "sharpness": ["--lengths", "4,8", "--samples", "4"],
}
FIGURES = {"evaluate": {"accuracy_vs_length.png"}, "gradients": {"blocks.png"},
           "attributions": {"occlusion.png", "components.png", "attention_reads.png"},
           "probes": {"probes_heatmap.png", "probes_position.png", "probes_compare.png"},
           "shortcuts": {"tests.png", "drops.png", "window.png", "tests.csv", "controls.csv"},
           "sharpness": {"sharpness.png"}}


def main_of(name: str):
    return importlib.import_module(CLIS[name]).main


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory) -> Path:
    task = make_task("interleaved", train_length=4)
    path = tmp_path_factory.mktemp("ckpt") / "hybrid.pt"
    return save_checkpoint(path, checkpoint_from_model(tiny_model("hybrid", task.vocab_size), task))


def one_error_line(err: str) -> str:
    assert err.startswith("error:") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("name", CLIS)
def test_help_lists_every_shared_flag_and_hides_old_spellings(name, capsys):
    assert main_of(name)(["--help"]) == 0
    text = capsys.readouterr().out
    for flag in SHARED:
        assert flag in text, f"{name} --help lacks {flag}"
    assert "1:400:25" in text, "the lengths grammar is documented in --help"
    for old in OLD_SPELLINGS.get(name, []):
        assert f"{old} " not in text and f"{old}," not in text and f"{old}\n" not in text


BAD_VALUES = [["--threads", "-2"], ["--seed", "x"], ["--samples", "0"], ["--lengths", "5:1"], ["--lengths", "a,b"],
              ["--samples", "2.5"]]


@pytest.mark.parametrize(("name", "bad"), [(n, b) for n in CLIS for b in BAD_VALUES])
def test_a_bad_value_exits_2_with_one_line_before_any_work(name, bad, capsys):
    assert main_of(name)(["any.pt", *bad]) == 2
    assert bad[0] in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("name", OLD_SPELLINGS)
def test_old_spellings_still_parse_to_the_shared_flag(name):
    from probe.cli import Parser

    module = importlib.import_module(CLIS[name])
    parser: Parser = module.build_parser()
    values = {"--length": "4,8", "--batch": "7", "--n-test": "7", "--sequences": "7"}
    for old in OLD_SPELLINGS[name]:
        args = parser.parse_args(["x.pt", old, values[old]])
        assert (args.lengths == [4, 8]) if old == "--length" else (args.samples == 7)


@pytest.mark.parametrize("name", CLIS)
def test_out_naming_a_file_is_one_line_and_exit_2(name, ckpt, tmp_path, capsys):
    out = tmp_path / "taken"
    out.write_text("not a directory")
    assert main_of(name)([str(ckpt), "--out", str(out)]) == 2
    assert "--out" in one_error_line(capsys.readouterr().err)
    assert out.read_text() == "not a directory"


@pytest.mark.parametrize("name", ANALYSES)
def test_a_length_that_cannot_fit_is_refused_before_any_work(name, ckpt, tmp_path, capsys):
    out = tmp_path / "out"
    assert main_of(name)([str(ckpt), "--lengths", "100000000", "--out", str(out)]) == 2
    assert "use lengths up to" in one_error_line(capsys.readouterr().err)
    assert not out.exists()


@pytest.mark.parametrize("name", CLIS)
def test_help_and_a_missing_path_do_not_import_the_models(name):
    """transformer_lens takes seconds to import: a user asking for --help or naming a wrong file should not wait."""
    args = ["/nonexistent.pt"]
    code = (f"import sys; from {CLIS[name]} import main; a = main(['--help']); b = main({args!r}); "
            "print(a, b, 'transformer_lens' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "0 2 False", done.stderr
    assert done.stderr.count("error:") == 1


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n in ("probes", "shortcuts") else n
                                  for n in ANALYSES])
def test_out_layout_is_results_json_plus_figures(name, ckpt, tmp_path, capsys):
    out = tmp_path / "out"
    assert main_of(name)([str(ckpt), *SMALL[name], "--json", "--out", str(out), "--device", "cpu"]) == 0
    obj = json.loads(capsys.readouterr().out)
    assert set(obj) >= {"probe_version", "command", "checkpoints", "results", "controls"}
    assert obj["command"] == name and obj["results"]
    assert json.loads((out / "results.json").read_text()) == obj
    names = {p.name for p in out.iterdir()}
    assert names >= {"results.json", *FIGURES[name]}
    assert not {n for n in names if n.endswith(".json")} - {"results.json"}, "one JSON file name for every CLI"
    for row in obj["controls"]:
        assert row["kind"] in ("instrument", "control") and isinstance(row["passed"], bool), row


def test_argparse_types_reject_what_they_should():
    assert positive_int("3") == 3 and nonnegative_int("0") == 0 and positive_float("1e-6") == 1e-6
    for f, bad in ((positive_int, "0"), (positive_int, "-2"), (positive_int, "1.5"), (nonnegative_int, "-1"),
                   (positive_float, "0"), (positive_float, "nan"), (positive_float, "inf"), (positive_float, "x")):
        with pytest.raises(argparse.ArgumentTypeError):
            f(bad)


def test_defaults_repeated_for_a_fast_help_agree_with_the_modules():
    from probe.gradients import cli as gcli
    from probe.gradients.lookahead import LookaheadConfig
    from probe.probes import cli as pcli
    from probe.probes.fit import HOOK_SUFFIXES
    from probe.probes.targets import CONTROL_TARGETS
    from probe.shortcuts import cli as scli
    from probe.shortcuts.positional import FLAG_THRESHOLD
    from probe.shortcuts.runs import DEFAULT_RUNS
    from probe.shortcuts.sums import DEFAULT_KS

    cfg = LookaheadConfig()
    assert (gcli.LOOKAHEAD_BATCHES, gcli.LOOKAHEAD_EVAL_BATCHES, gcli.LOOKAHEAD_STEP, gcli.LOOKAHEAD_SCALES,
            gcli.LOOKAHEAD_RANDOM) == (cfg.n_batches, cfg.eval_batches, cfg.rel_step, cfg.scales, cfg.n_random)
    assert (pcli.HOOK_SUFFIXES, pcli.CONTROL_TARGETS) == (HOOK_SUFFIXES, CONTROL_TARGETS)
    assert (scli.DEFAULT_KS, scli.DEFAULT_RUNS, scli.FLAG_THRESHOLD) == (DEFAULT_KS, DEFAULT_RUNS, FLAG_THRESHOLD)


@pytest.mark.parametrize("name", EVERY_CLI)
def test_every_cli_takes_no_progress(name, capsys):
    main = importlib.import_module(EVERY_CLI[name]).main
    assert main(["collect", "--help"] if name == "results" else ["--help"]) == 0
    assert "--no-progress" in capsys.readouterr().out


@pytest.mark.parametrize("name", [*CLIS, "transitions"])
def test_an_unwritable_out_is_one_line_and_exit_2_and_leaves_nothing(name, ckpt, tmp_path, capsys):
    main = importlib.import_module(EVERY_CLI[name]).main
    assert main([str(ckpt), "--out", "/proc/probe-test/out"]) == 2
    err = one_error_line(capsys.readouterr().err)
    assert "--out /proc/probe-test/out: cannot write there" in err


@pytest.mark.parametrize(("name", "argv"), [("train", ["--preset", "lstm", "--steps", "2"]), ("retrain", ["{ckpt}"]),
                                          ("sweep", ["--preset", "lstm", "--seeds", "0", "--steps", "2"])])
def test_the_commands_that_train_refuse_an_unwritable_out_in_one_line_before_training(name, argv, ckpt, capsys):
    # python -m probe.train --out /proc/x/y ended in a traceback from the run folder's lock before it was on the runner
    main = importlib.import_module(EVERY_CLI[name]).main
    assert main([a.format(ckpt=ckpt) for a in argv] + ["--out", "/proc/probe-test/out"]) == 2
    assert "--out /proc/probe-test/out: cannot write there" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize("name", ["sharpness", "gradients"])
def test_an_unwritable_out_answers_within_5_s_without_starting_the_analysis(name, ckpt):
    """The check comes before torch is imported: it costs the start of the command, not the analysis."""
    code = (f"import sys, time; t = time.perf_counter(); from {CLIS[name]} import main; "
            f"rc = main([{str(ckpt)!r}, '--out', '/proc/x']); print(rc, 'torch' in sys.modules, "
            "time.perf_counter() - t)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    rc, torch_imported, seconds = done.stdout.split()
    assert (rc, torch_imported) == ("2", "False") and float(seconds) < 5, done.stderr
    assert done.stderr.startswith("error: --out /proc/x") and done.stderr.count("\n") == 1


def test_a_run_shows_progress_on_stderr_also_under_json_unless_no_progress(ckpt, capsys):
    main = main_of("sharpness")
    assert main([str(ckpt), *SMALL["sharpness"], "--json"]) == 0
    captured = capsys.readouterr()
    json.loads(captured.out)  # stdout stays one JSON object
    assert "lengths" in captured.err
    assert main([str(ckpt), *SMALL["sharpness"], "--json", "--no-progress"]) == 0
    assert capsys.readouterr().err == ""



@pytest.mark.parametrize("name", ["gradients", "train", "sweep"])
def test_a_folder_named_probe_in_the_way_is_one_line_and_exit_2(name, tmp_path):
    # from the parent of a clone named probe/ (or any folder holding an empty probe/), Python takes that folder for
    # the package; the command must say so in one line instead of a traceback about __version__
    (tmp_path / "probe").mkdir()
    done = subprocess.run([sys.executable, "-m", f"probe.{name}", str(ROOT / "checkpoints" / "hybrid-joint.pt")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [done.stderr.strip()]
    assert "folder named probe" in done.stderr and str((tmp_path / "probe").resolve()) in done.stderr


def test_a_bare_module_name_where_a_checkpoint_goes_asks_for_module_colon_factory(capsys):
    from probe.gradients.cli import main

    assert main(["my_hybrid", "--no-lookahead"]) == 2
    err = capsys.readouterr().err
    assert "no such file" in err and "MODULE:FACTORY" in err
