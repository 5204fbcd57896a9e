"""One configuration type for every suite.

A suite writes its numbers down twice, as two dicts: the full run's (``FULL``) and the
values ``--quick`` replaces (``QUICK``: tiny tables and short rounds, a smoke test of the
scripts whose numbers are noise). :meth:`Config.choose` picks one set; the result is a
plain namespace (``cfg.rounds``) that a driver's options may override
(:meth:`Config.override`), and :meth:`Config.as_dict` is what goes into the JSON.
Values derived from the chosen ones (capacities per item size, ...) are computed once by
the suite's ``make_config`` and stored beside them, so the JSON records them too.
"""

from __future__ import annotations

from types import SimpleNamespace

MiB = 1 << 20


class Config(SimpleNamespace):
    """One run's numbers for a suite (see the module docstring)."""

    @classmethod
    def choose(cls, quick: bool, budget: float | None, full: dict, quick_values: dict) -> "Config":
        """``full`` (with ``quick_values`` over it if ``quick``), ``budget_seconds``
        replaced by ``budget`` when one is given."""
        unknown = set(quick_values) - set(full)
        if unknown:
            raise ValueError(f"quick values {sorted(unknown)} have no full-run value")
        values = {**full, **quick_values} if quick else dict(full)
        if budget:
            values["budget_seconds"] = budget
        return cls(quick=quick, **values)

    def override(self, args, *names: str) -> "Config":
        """Each value of ``names`` that the parsed options ``args`` give (not None) replaces
        the chosen one (``--rounds 5`` over ``rounds``); returns this config."""
        for name in names:
            value = getattr(args, name)
            if value is not None:
                setattr(self, name, value)
        return self

    def as_dict(self) -> dict:
        return dict(vars(self))
