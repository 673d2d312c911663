"""Composition of a prediction: scenario -> step plan -> priced op graph -> engine -> metrics."""
