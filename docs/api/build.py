"""Build probe's API reference from its docstrings with pdoc: python docs/api/build.py [--out DIR] (HTML)."""

from __future__ import annotations

import argparse
import os
import pkgutil
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent


def modules() -> list[str]:
    """Every public module of probe. ``probe`` lists only its exports in ``__all__``, and some subpackages load
    their parts lazily, so pdoc would not find every module from the top one alone; ``__main__`` modules run a CLI
    when imported and are left out."""
    import probe

    found = ["probe"] + [m.name for m in pkgutil.walk_packages(probe.__path__, "probe.")]
    return [m for m in found if not any(part.startswith("_") for part in m.split("."))]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, default=HERE / "html", help="output directory (default docs/api/html)")
    args = p.parse_args(argv)
    os.environ.setdefault("MPLBACKEND", "Agg")
    try:
        import pdoc
    except ModuleNotFoundError:
        raise SystemExit("pdoc is not installed: pip install -c constraints.txt -e '.[docs]'") from None
    with warnings.catch_warnings():
        # a subpackage that pdoc walks itself is also in the list: one page each, as wanted
        warnings.filterwarnings("ignore", message="The module specification")
        pdoc.pdoc(*modules(), output_directory=args.out)
    print(f"wrote {sum(1 for _ in args.out.rglob('*.html'))} pages to {args.out} (open {args.out / 'index.html'})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
