"""Metropolis machinery around the race: surrogate, proposals, back-off, cost model, audits."""
