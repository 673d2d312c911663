"""The SimPy engine: executes plans (transfers with dependencies) over links that share bandwidth."""
