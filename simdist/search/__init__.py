"""Layout search and hardware comparison: enumerate layouts, prune what cannot run, rank with the closed form
(simdist.analytic.step), re-simulate the best with the engine (simdist.predict), sweep on local processes or Dask."""
