"""The scaling laws, resolved once: the registry of laws and the one place where ``--law``,
``--approach`` and ``--form`` become the law a fit, a plot, a study or a hold-out asks.

    law = law_named("chinchilla", approach=3)   # raises FitInputError naming the flag
    fit_table(table, law=law, n_bootstrap=200)  # a ScalingFit (attnlab.scaling.tables.fitting)
    law.can("run-loss"), law.can("allocation")  # what its fit can answer (law.CAPABILITIES)

A law is one class beside the code that fits it and one line below; its family (``--law``) is
the class's ``name`` and its ``variant`` the ``--approach`` or ``--form`` that selects it.
"""

from __future__ import annotations

from attnlab.scaling.errors import FitInputError
from attnlab.scaling.law import Law
from attnlab.scaling.laws import (annealing, approach1, approach2, approach3, clark,
                                  data_constrained, hparams, kaplan, loss_to_loss, multipower,
                                  overtrain, two_step)

LAWS = {(c.name, c.variant): c for c in (
    kaplan.KaplanJoint, kaplan.KaplanSize, kaplan.KaplanData,
    approach1.Envelope, approach2.IsoFLOP, approach3.Parametric,
    clark.Clark, hparams.HParams, data_constrained.DataConstrained, overtrain.Overtrain,
    multipower.MultiPower, annealing.Annealing, loss_to_loss.LossToLoss, two_step.TwoStep)}


def names() -> tuple[str, ...]:
    """The ``--law`` values."""
    return tuple(dict.fromkeys(name for name, _ in LAWS))


def variants(name: str) -> tuple:
    return tuple(v for family, v in LAWS if family == name)


def every_law() -> tuple[Law, ...]:
    """One of each registered law, in the registry's order."""
    return tuple(cls() for cls in LAWS.values())


def law_flags(report: bool = True) -> list:
    """The flags the registered laws declare (each family's selector, then each law's own and,
    with ``report``, its report's), one per name, in the registry's order: what ``attnlab fit``
    (with its report) and ``attnlab plot`` (without) add to their own."""
    found = {}
    for law in every_law():
        selector = (law.selector,) if law.selector else ()
        for flag in selector + law.flags + (law.report_flags if report else ()):
            found.setdefault(flag.name, flag)
    return list(found.values())


def law_named(law: str | Law, approach: int | None = None, form: str | None = None) -> Law:
    """The law ``--law`` names, in the variant ``--approach`` / ``--form`` select (each family
    reads its own selector and ignores the other's); a ``Law`` is returned as it is."""
    if isinstance(law, Law):
        return law
    family = [cls for (name, _), cls in LAWS.items() if name == law]
    if not family:
        raise FitInputError(f"--law must be one of {', '.join(names())}, not {law!r}")
    flag = family[0].selector.name if family[0].selector else None
    chosen = {"approach": approach, "form": form}.get(flag)
    variant = family[0].default_variant if chosen is None else chosen
    if (law, variant) not in LAWS:
        allowed = ", ".join(str(v) for v in variants(law))
        raise FitInputError(f"--{flag} must be one of {allowed} for --law={law}, "
                            f"not {variant!r}")
    return LAWS[(law, variant)]()
