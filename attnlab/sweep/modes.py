"""A sweep's modes: what ``sweep.mode`` plans, each mode one class that checks its own sections
and names the config keys it sets, and the registry the name selects from. The spec, the
planner and the dry run ask the mode, never compare its name.

grid:     every shape x every combination of the axes, each run as its base config says
isoflop:  each budget of ``sweep.budgets`` trains every shape for budget / FLOPs-per-token tokens
curves:   the grid, each run evaluated at ``sweep.curve_points`` points (learning curves for
          Chinchilla's approach 1)
ladder:   every shape trains one constant-rate trunk and a cooldown branch per token count of
          ``sweep.branches`` (Hägele et al. 2024)
"""

from __future__ import annotations

from typing import Any

from attnlab.sweep.sections import SweepSpecError

OFF_CENTRE = "outside the centred ladder"  # why IsoFLOP leaves a shape out of a budget


class Mode:
    """uses_budgets / uses_branches / uses_curve_points: the spec sections only this mode
    reads; fitted_by_chinchilla: planned for Chinchilla's IsoFLOP fits (the dry run checks
    whether the plan pins approach 3's law)."""

    name = ""
    uses_budgets = False
    uses_branches = False
    uses_curve_points = False
    fitted_by_chinchilla = False

    def check(self, spec, n_shapes: int) -> None:
        """The mode's needs of the spec (``definition.SweepSpec``)."""

    def set_keys(self, spec) -> dict[str, str]:
        """Config keys the mode sets in every run, each mapped to the spec field that sets it."""
        return {}

    def budgets(self, spec) -> list[float | None]:
        """The FLOP budgets the planner plans every shape at (None: no budget)."""
        return [None]

    def run_length(self, spec, budget: float | None, counts: dict[str, int],
                   per_token: dict[str, float], batch_tokens: int) -> dict[str, Any] | str:
        """The config values that set one run's length (none: the base config's), or why the
        run is left out. counts: ``model.param_counts``; per_token: ``flops_per_token``."""
        return {}


class GridMode(Mode):
    name = "grid"


class IsoFLOPMode(Mode):
    name = "isoflop"
    uses_budgets = fitted_by_chinchilla = True

    def check(self, spec, n_shapes):
        if not spec.budgets:
            raise SweepSpecError("sweep.budgets", "empty: isoflop mode needs compute budgets "
                                                  "in FLOPs, e.g. (1e12, 3e12)")
        if n_shapes < 2:
            raise SweepSpecError("sweep.shapes", "isoflop mode needs at least 2 shapes "
                                                 "(sweep.shapes or sweep.ladder)")

    def set_keys(self, spec):
        return {"train.tokens": "sweep.budgets", "train.steps": "sweep.budgets"}

    def budgets(self, spec):
        return list(spec.budgets)

    def run_length(self, spec, budget, counts, per_token, batch_tokens):
        steps = round(budget / per_token[spec.flops_per_token] / batch_tokens)
        if steps < spec.min_steps:
            return f"fewer than {spec.min_steps} step(s)"
        # centred on the parameters a token uses (a mixture of experts' active ones)
        if spec.centre is not None and not spec.centre.keeps(counts["active"], budget):
            return (f"{OFF_CENTRE}: {counts['active']:,} parameters, N* = "
                    f"{spec.centre.target(budget):,.0f} +- {spec.centre.span:g}x")
        return {"train.tokens": steps * batch_tokens}


class CurvesMode(Mode):
    name = "curves"
    uses_curve_points = True

    def check(self, spec, n_shapes):
        if spec.curve_points <= 0:
            raise SweepSpecError("sweep.curve_points", "curves mode needs curve_points > 0 "
                                                       "(validation points per run)")

    def set_keys(self, spec):
        return {"train.eval_every": "sweep.curve_points"} if spec.curve_points > 0 else {}


class LadderMode(Mode):
    name = "ladder"
    uses_branches = fitted_by_chinchilla = True
    # The trunk's schedule and length and each branch's cooldown come from sweep.branches.
    SET_KEYS = ("train.tokens", "train.steps", "train.schedule", "train.decay_fraction",
                "train.cooldown", "train.branch_from", "train.branch_step", "train.keep_steps")

    def check(self, spec, n_shapes):
        if spec.branches is None:
            raise SweepSpecError("sweep.branches", "ladder mode needs the branches' token counts"
                                 ", e.g. sweep.branches.tokens_per_param = (5, 10, 20, 40)")
        if spec.warmup.kind.per_run_length:
            raise SweepSpecError("sweep.warmup.rule", "a trunk and its branches share their "
                                 "warmup: use rule fixed or tokens_per_param, not fraction "
                                 "(of each run's length)")

    def set_keys(self, spec):
        return dict.fromkeys(self.SET_KEYS, "sweep.branches")

    def budgets(self, spec):
        return []  # its runs are each shape's trunk and branches (planner.ladder_runs)


MODES = {c.name: c for c in (GridMode, IsoFLOPMode, CurvesMode, LadderMode)}


def check(spec, n_shapes: int) -> None:
    """``sweep.mode``'s needs, and a refusal of the sections only another mode reads."""
    mode = MODES[spec.mode]()
    for section, uses in (("budgets", "uses_budgets"), ("branches", "uses_branches")):
        if getattr(spec, section) not in ((), None) and not getattr(mode, uses):
            owner = next(m.name for m in MODES.values() if getattr(m, uses))
            raise SweepSpecError(f"sweep.{section}", f"only {owner} mode uses {section}; mode "
                                                     f"is {spec.mode!r}")
    mode.check(spec, n_shapes)
