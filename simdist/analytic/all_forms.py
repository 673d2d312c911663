"""Imports every closed-form module so that each registers itself in simdist.analytic.registry."""

import simdist.analytic.collnet
import simdist.analytic.direct
import simdist.analytic.halving_doubling
import simdist.analytic.hierarchical
import simdist.analytic.nvls
import simdist.analytic.nvls_sharp
import simdist.analytic.nvls_tree
import simdist.analytic.pat
import simdist.analytic.tree  # noqa: F401
from simdist.analytic import ring  # noqa: F401
