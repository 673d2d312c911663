"""Imports every algorithm module so that each registers itself in simdist.collectives.registry."""

import simdist.collectives.collnet
import simdist.collectives.direct
import simdist.collectives.halving_doubling
import simdist.collectives.hierarchical
import simdist.collectives.nvls
import simdist.collectives.nvls_sharp
import simdist.collectives.nvls_tree
import simdist.collectives.pat
import simdist.collectives.tree  # noqa: F401
from simdist.collectives import ring  # noqa: F401
