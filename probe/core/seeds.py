"""The one registry of seed bases: where each analysis draws its sequences from, apart from every other draw."""

from __future__ import annotations

from types import MappingProxyType

from probe.errors import ProbeError

TRAIN_SEEDS = "seed * 1_000_003 + step"
"""How the trainer seeds its batches; every base below is at least 7e9, far above any training seed."""

_BASES: dict[str, int] = {}
SHARED: dict[str, str] = {}
"""Names allowed to reuse an existing base, with the reason. These pairs shipped before the registry existed: moving
either base would change every number they produced, and their draws do not meet in one computation (the pairs
differ in how they offset the base, and never feed the same statistic)."""


def register(name: str, base: int, shares_with: str | None = None, why: str = "") -> int:
    """Add ``name`` with ``base`` and return the base. A base already taken by another name is refused unless
    ``shares_with`` names that owner (and ``why`` says why the reuse is harmless); a new analysis takes a free
    base."""
    if name in _BASES:
        if _BASES[name] == base:
            return base
        raise ProbeError(f"seed base {name!r} is already registered as {_BASES[name]}")
    owner = next((n for n, b in _BASES.items() if b == base), None)
    if owner is not None and owner != shares_with:
        raise ProbeError(f"seed base {base} of {name!r} is already used by {owner!r}: choose another base")
    if owner is not None:
        SHARED[name] = f"shares {base} with {owner}: {why}"
    _BASES[name] = base
    return base


def seed_base(name: str) -> int:
    """The base registered for ``name``."""
    try:
        return _BASES[name]
    except KeyError:
        raise ProbeError(f"no seed base named {name!r}; known: {', '.join(sorted(_BASES))}") from None


def bases() -> MappingProxyType[str, int]:
    """Every registered base, read-only."""
    return MappingProxyType(_BASES)


EVALUATE = register("evaluate", 7_000_000_000)
GRADIENTS = register("gradients", 8_000_000_000)  # interference batches, also the attributions' batches
PROBES = register("probes", 8_000_000_000, shares_with="gradients",
                  why="probe data sit seed * 1e6 (+ 5e5 for test data) above it, gradient batches seed * 1e6 + length; "
                      "the two analyses never combine their draws")
ATTENTION = register("attention", 8_100_000_000)
SHORTCUT_WINDOW = register("shortcut_window", 8_300_000_000)
SHORTCUTS = register("shortcuts", 8_400_000_000)
SHORTCUT_SUMS = register("shortcut_sums", 8_500_000_000)
SHORTCUT_POSITIONAL = register("shortcut_positional", 8_600_000_000)
LOOKAHEAD = register("lookahead", 9_000_000_000)
PATCHING = register("patching", 9_000_000_000, shares_with="lookahead",
                    why="patching pairs are seed * 1e6 + length * 100 + k above it, lookahead batches seed * 1e7 + "
                        "index; no computation uses both")
