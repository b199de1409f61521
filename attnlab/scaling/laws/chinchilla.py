"""Hoffmann et al. 2022's family of laws: what approaches 1-3 share."""

from __future__ import annotations

from collections.abc import Mapping

from attnlab.cli_vocab import Flag
from attnlab.scaling import equations
from attnlab.scaling.law import Law


class ChinchillaLaw(Law):
    """Hoffmann et al. 2022's three approaches; ``--approach`` picks one. Their FLOPs column
    is Chinchilla's own count where the table has it."""

    name = "chinchilla"
    selector = Flag("approach", "enum", None, "Chinchilla approach (default 3).",
                    enum_values=("1", "2", "3"))
    default_variant = 3
    flops_columns = ("flops_chinchilla", "flops")
    capabilities = frozenset({"table", "allocation"})

    @property
    def approach(self) -> int:
        return self.variant

    def optimal(self, params: Mapping, c, flops_per_param_token: float):
        return equations.power_law_optimal(params, c)
