"""Errors and warnings of the scaling-law fits."""

from __future__ import annotations

from attnlab.errors import AttnlabError


class FitInputError(AttnlabError):
    """The table handed to a fit is unusable: a missing column, a non-positive or non-finite
    value, too few points or budgets. The message names the file and the column."""


class FitError(AttnlabError):
    """A fit ran but produced nothing usable (e.g. no start of the grid converged)."""


class GridEdgeWarning(UserWarning):
    """The best fit lies on or beyond the edge of the initialisation grid: the grid may not
    span the basin of the optimum, so widen it and refit."""
