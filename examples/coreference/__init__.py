"""The author-coreference example's model and sampler (not part of the installed package).

:mod:`coreference.model` (mentions, pair features, factor weights, the B³
score) and :mod:`coreference.factor_gibbs` (the racing Gibbs sampler for
clustering models with pairwise factors). ``python examples/author_coreference.py``
finds this package next to the script; the tests and the documentation build
add ``examples`` to ``sys.path``.
"""
