"""The analysis runner: an options dataclass is the command line, a Report is what it prints and writes, and every
analysis CLI is one such command."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from probe.cli import positive_int
from probe.errors import ProbeError
from probe.runner import (
    CheckpointOptions,
    Command,
    CommandGroup,
    CommandOptions,
    Options,
    Report,
    lengths_option,
    option,
    samples_option,
)

ROOT = Path(__file__).resolve().parents[1]

COMMANDS = {"evaluate": "probe.evaluate", "gradients": "probe.gradients.cli", "attributions": "probe.attributions.cli",
            "probes": "probe.probes.cli", "shortcuts": "probe.shortcuts.cli", "sharpness": "probe.sharpness.cli",
            "transitions": "probe.transitions"}


@dataclass
class ToyOptions(CheckpointOptions):
    lengths: list[int] | None = lengths_option("4 and 8", aliases=["--length"])
    samples: int = samples_option(3, aliases=["--batch"])
    n_heads: int = option(2, "heads to look at (default %(default)s)", type=positive_int)
    fast: bool = option(False, "skip the slow part")
    mode: str = option("a", "a or b", choices=("a", "b"), order=-1)
    ks: list[int] = option([1, 2], "spans")


def save_rows(out, result) -> list[str]:
    (out / "rows.csv").write_text(str(len(result["results"])))
    return ["rows.csv"]


def toy_run(opts: ToyOptions) -> Report:
    if opts.mode == "b":
        raise ProbeError("mode b: not on this machine; use --mode a")
    rows = [{"checkpoint": c, "length": n, "value": float("nan") if opts.fast else 1.0}
            for c in opts.checkpoints for n in opts.lengths or [4, 8]]
    return Report(list(opts.checkpoints), rows, [{"control": "toy", "kind": "instrument", "passed": True}],
                  text=f"{len(rows)} rows", figures=lambda: {}, extra={"notes": ["toy"]},
                  save=save_rows)


TOY = Command("toy", ToyOptions, toy_run, "A toy analysis.", "JSON rows: checkpoint, length, value.")


def test_fields_become_flags_with_their_help_and_defaults(capsys):
    assert TOY.main(["--help"]) == 0
    text = capsys.readouterr().out
    for flag in ("--lengths", "--samples", "--n-heads", "--fast", "--mode", "--ks", "--threads", "--json", "--out",
                 "--device", "--seed"):
        assert flag in text, flag
    assert "(default 2)" in text and "JSON rows: checkpoint" in text and "1:400:25" in text
    assert "--length " not in text and "--batch" not in text, "old spellings are hidden"
    # the command's own flags sit between the shared head and the shared tail; order=-1 comes first
    assert text.index("--mode") < text.index("--lengths") < text.index("--n-heads") < text.index("--threads")
    assert text.index("--threads") < text.index("--json") < text.index("--seed")


def test_parse_gives_the_options_dataclass_and_old_spellings_parse_to_the_new_field():
    opts = TOY.parse(["a.pt", "b.pt", "--length", "4,8", "--batch", "5", "--fast", "--n-heads", "3"])
    assert isinstance(opts, ToyOptions)
    assert (opts.checkpoints, opts.lengths, opts.samples, opts.fast, opts.n_heads) == (["a.pt", "b.pt"], [4, 8], 5,
                                                                                        True, 3)
    assert (opts.seed, opts.device, opts.json, opts.out, opts.threads, opts.ks) == (0, "auto", False, None, 1, [1, 2])
    assert TOY.parse(["a.pt"]).ks is not TOY.parse(["a.pt"]).ks, "a list default is not shared"


def test_json_prints_the_envelope_and_out_writes_it_with_the_report_files(tmp_path, capsys):
    ckpt = tmp_path / "a.pt"
    ckpt.write_text("")
    out = tmp_path / "out"
    assert TOY.main([str(ckpt), "--json", "--fast", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    obj = json.loads(printed)
    assert printed.count("\n") == 1, "exactly one JSON object and nothing else"
    assert set(obj) == {"probe_version", "command", "checkpoints", "results", "controls", "notes"}
    assert obj["command"] == "toy" and obj["checkpoints"] == [str(ckpt)]
    assert [r["value"] for r in obj["results"]] == [None, None], "NaN is written as null"
    assert json.loads((out / "results.json").read_text()) == obj and (out / "rows.csv").read_text() == "2"
    assert TOY.main([str(ckpt)]) == 0
    assert capsys.readouterr().out == "2 rows\n"


@pytest.mark.parametrize(("argv", "words"), [(["{ckpt}", "--mode", "b"], "use --mode a"),
                                             (["{ckpt}", "--n-heads", "0"], "--n-heads"),
                                             (["{ckpt}", "--mode", "c"], "--mode"),
                                             (["{missing}"], "no such file")])
def test_a_user_error_is_one_line_and_exit_2(argv, words, tmp_path, capsys):
    ckpt = tmp_path / "a.pt"
    ckpt.write_text("")
    assert TOY.main([a.format(ckpt=ckpt, missing=tmp_path / "nope.pt") for a in argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error:") and captured.err.count("\n") == 1
    assert words in captured.err


def test_a_command_without_checkpoints_has_only_the_shared_flags(capsys):
    @dataclass
    class Plain(Options):
        what: str = option("x", "what to do")

    cmd = Command("plain", Plain, lambda o: Report([], [{"what": o.what, "seed": o.seed}]), "Plain.")
    assert cmd.main(["--what", "y", "--seed", "3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["results"] == [{"what": "y", "seed": 3}]
    assert cmd.main(["x.pt"]) == 2, "no positional checkpoints"


@pytest.mark.parametrize("name", COMMANDS)
def test_every_analysis_cli_is_one_command_on_the_runner(name):
    module = importlib.import_module(COMMANDS[name])
    assert isinstance(module.COMMAND, Command) and module.COMMAND.name == name
    assert module.main == module.COMMAND.main and module.build_parser == module.COMMAND.build_parser
    assert module.COMMAND.epilog, "--help documents the JSON columns (figures: the figures it makes)"


def test_out_is_tried_for_writing_and_what_the_try_made_is_removed(tmp_path):
    from probe.runner import check_writable

    check_writable(tmp_path / "new" / "deeper")
    assert not (tmp_path / "new").exists(), "a refused or failed run leaves no folder behind"
    kept = tmp_path / "kept"
    kept.mkdir()
    (kept / "old.txt").write_text("x")
    check_writable(kept)
    assert sorted(p.name for p in kept.iterdir()) == ["old.txt"]
    with pytest.raises(ProbeError, match="cannot write there"):
        check_writable(kept / "old.txt" / "sub")


def test_a_write_that_fails_after_the_check_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    import errno

    import probe.runner as runner

    def full_disk(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(runner, "write_outputs", full_disk)
    ckpt = tmp_path / "a.pt"
    ckpt.write_text("")
    assert TOY.main([str(ckpt), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "writing the results failed (No space left on device)" in err


def test_progress_is_on_under_json_and_off_with_no_progress():
    assert TOY.parse(["a.pt", "--json"]).progress
    assert not TOY.parse(["a.pt", "--json", "--no-progress"]).progress


def test_every_command_defaults_to_the_same_thread_count():
    """One default for every command (a new user found three on torch's default, one per core, and three on 1)."""
    import importlib

    from probe.cli import DEFAULT_THREADS

    for name in ("evaluate", "gradients", "attributions", "probes", "shortcuts", "sharpness", "transitions"):
        try:
            command = importlib.import_module(f"probe.{name}.cli").COMMAND
        except ModuleNotFoundError:
            command = importlib.import_module(f"probe.{name}").COMMAND
        threads = next(a for a in command.build_parser()._actions if a.dest == "threads")
        assert threads.default == DEFAULT_THREADS, f"probe.{name} defaults to --threads {threads.default}"


# --- every command on the runner ---------------------------------------------------------------------------------
def entry_points(package: Path) -> dict[str, str]:
    """Every ``python -m NAME`` under ``package``, found from the files alone: a package's ``__main__.py`` (NAME is
    the package; its ``main`` is imported from the module named, or defined there), or a module that runs under
    ``if __name__ == "__main__":``. Maps NAME to the module whose ``main`` the command runs."""
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        module = ".".join(parts)
        tree = ast.parse(path.read_text())
        if path.name == "__main__.py":
            source = next((node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
                           and any(alias.name == "main" for alias in node.names)), None)
            found[".".join(parts[:-1])] = source or module
        elif any(isinstance(node, ast.If) and ast.unparse(node.test) in ("__name__ == '__main__'",
                                                                          "'__main__' == __name__")
                 for node in tree.body):
            found[module] = module
    return found


def built_on_runner(main) -> bool:
    """Whether ``main`` is a runner command's (or command group's) ``main``, not a parser built by hand."""
    return isinstance(getattr(main, "__self__", None), (Command, CommandGroup))


EVERY_COMMAND = {"probe.evaluate", "probe.gradients", "probe.attributions", "probe.probes", "probe.shortcuts",
                 "probe.sharpness", "probe.transitions", "probe.train", "probe.retrain", "probe.sweep",
                 "probe.results", "probe.checkpoint"}
NOT_YET: dict[str, str] = {}
"""Commands still built by hand, each with its reason; an entry that is on the runner by now fails the test, so the
list only shrinks."""


def test_every_python_m_probe_command_is_built_on_the_runner():
    """One place for the shared behaviour (--json, --no-progress, one-line errors with exit 2, SIGINT and SIGTERM):
    a command whose parser is built by hand fails here, found from the files, not from a list."""
    found = entry_points(ROOT / "probe")
    assert set(found) >= EVERY_COMMAND, f"the walk missed {EVERY_COMMAND - set(found)}"
    hand_built = {name for name, module in found.items()
                  if not built_on_runner(importlib.import_module(module).main)}
    assert not hand_built - set(NOT_YET), f"built by hand, not on probe.runner.Command: {hand_built - set(NOT_YET)}"
    assert not set(NOT_YET) - hand_built, f"on the runner now: drop {set(NOT_YET) - hand_built} from NOT_YET"


def test_a_planted_hand_built_command_is_found_and_refused(tmp_path, monkeypatch):
    """The instrument check: a module that runs an argparse main of its own, and a package whose __main__.py
    imports one, are both found and refused; a runner command's main passes."""
    pkg = tmp_path / "planted"
    (pkg / "tool").mkdir(parents=True)
    hand = "import argparse\n\ndef main(argv=None):\n    return argparse.ArgumentParser().parse_args(argv) and 0\n"
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text(hand + '\nif __name__ == "__main__":\n    main()\n')
    (pkg / "tool" / "__init__.py").write_text("")
    (pkg / "tool" / "cli.py").write_text(hand)
    (pkg / "tool" / "__main__.py").write_text("from planted.tool.cli import main\n\nmain()\n")
    (pkg / "lib.py").write_text("def main():\n    pass\n")  # no entry point: not a command
    assert entry_points(pkg) == {"planted.mod": "planted.mod", "planted.tool": "planted.tool.cli"}
    monkeypatch.syspath_prepend(str(tmp_path))
    for module in entry_points(pkg).values():
        assert not built_on_runner(importlib.import_module(module).main)
    assert built_on_runner(TOY.main)


def test_a_report_s_exit_code_and_envelope_come_back_through_the_runner(capsys):
    envelope = {"probe_version": "x", "command": "toy --mode", "checkpoints": [], "results": [{"a": 1}],
                "controls": [], "claims": "c.toml"}
    cmd = Command("toy", CommandOptions, lambda o: Report.of_envelope(envelope, exit_code=1), "Toy.")
    assert cmd.main([]) == 1  # e.g. a sweep whose run failed
    assert capsys.readouterr().out == "", "no --json flag, nothing on stdout"

    @dataclass
    class WithJson(CommandOptions):
        json: bool = option(False, "one object")

    cmd = Command("toy", WithJson, lambda o: Report.of_envelope(envelope), "Toy.")
    assert cmd.main(["--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert {k: v for k, v in printed.items() if k != "probe_version"} == {
        k: v for k, v in envelope.items() if k != "probe_version"}


@dataclass
class GroupOptions(CommandOptions):
    src: str = option("", "where from", positional=True)
    tags: list[str] = option([], "a tag (repeat the flag)", flag="--tag", action="append", metavar="T")
    to: str | None = option(None, "where to", metavar="DIR", required=True)


def test_a_command_group_parses_and_runs_each_command_as_the_runner_does(capsys):
    def copy(opts: GroupOptions) -> Report:
        if opts.src == "bad":
            raise ProbeError("bad: no such thing")
        print(opts.src, opts.tags, opts.to, opts.progress)
        return Report([], [])

    group = CommandGroup("toys", "Toys.", (Command("copy", GroupOptions, copy, "Copy a toy.", summary="copy one"),))
    assert group.main(["copy", "a", "--tag", "x", "--tag", "y", "--to", "b", "--no-progress"]) == 0
    assert capsys.readouterr().out == "a ['x', 'y'] b False\n"
    assert group.main(["--help"]) == 0 and "copy      copy one" in capsys.readouterr().out
    assert group.main(["copy", "--help"]) == 0
    assert "usage: python -m probe.toys copy [-h]" in capsys.readouterr().out
    for argv, words in ((["copy", "a"], "required: --to"), (["copy", "bad", "--to", "b"], "bad: no such thing"),
                        (["paste"], "invalid choice")):
        assert group.main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("error:") and err.count("\n") == 1 and words in err, err


def test_sigterm_stops_a_command_with_one_line_and_exit_130():
    """SIGTERM (a scheduler's stop) is handled like Ctrl-C by every command: one line, exit 130, no traceback; a
    command's ``stopped`` writes that line. Without the runner's handler SIGTERM would end the process (-15)."""
    code = """
import os, signal, sys
from probe.runner import Command, CommandOptions, Report

def run(opts):
    os.kill(os.getpid(), signal.SIGTERM)
    return Report([], [])

plain = Command("toy", CommandOptions, run, "Toy.")
told = Command("toy", CommandOptions, run, "Toy.", stopped=lambda o, argv, kept, sig: f"stopped by {sig}: {argv}")
print(plain.main([]), told.main(["--no-progress"]))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.stdout.split() == ["130", "130"], done.stderr
    assert done.stderr.splitlines() == ["error: interrupted", "stopped by SIGTERM: ['--no-progress']"]
