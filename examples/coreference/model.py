r"""Author coreference: mentions, pair features, factor weights and the B³ score.

Companion of :class:`~coreference.factor_gibbs.PairwiseFactorGibbs`
for the author-coreference experiment of Chen & Ghahramani (2016, Sec. 5.3):

- :func:`power_law_mentions` generates author mentions (names, middle
  initial, affiliation, topic words, year) of entities whose numbers of
  mentions follow a power law, grouped in blocks of ambiguous names
  ("J. Smith"), so that clusters reach thousands of mentions;
- :func:`mention_pair_features` compares two mentions field by field
  (Jaro–Winkler similarity of strings, agreement of initials, Jaccard overlap
  of topic words, year gap);
- :func:`fit_pair_logistic` fits :math:`\theta` by logistic regression on
  labelled pairs, and :func:`pair_log_odds` turns a pair's features into the
  log factor :math:`w(x_i, x_j) = \theta_0 + \theta^\top \phi(x_i, x_j)`, the
  log-odds that the two mentions corefer;
- :func:`b_cubed` is the B³ precision, recall and F1 of Bagga & Baldwin (1998).

The string similarity needs the ``jellyfish`` package (installed with the
``examples`` extra).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import optimize

__all__ = [
    "FEATURE_NAMES",
    "Mentions",
    "b_cubed",
    "fit_pair_logistic",
    "mention_pair_features",
    "pair_log_odds",
    "power_law_mentions",
    "sample_block_pairs",
]

#: Columns of :func:`mention_pair_features`.
FEATURE_NAMES = (
    "first_name_jw",
    "first_initial_only",
    "middle_initial",
    "last_name_jw",
    "affiliation_jw",
    "topic_jaccard",
    "year_gap",
)


def b_cubed(predicted, truth) -> tuple[float, float, float]:
    r"""B³ precision, recall and F1 of a clustering (Bagga & Baldwin 1998).

    For mention :math:`i` with predicted cluster :math:`P_i` and true cluster
    :math:`T_i`,

    .. math:: \mathrm{P} = \frac{1}{n}\sum_i \frac{|P_i \cap T_i|}{|P_i|}, \quad
              \mathrm{R} = \frac{1}{n}\sum_i \frac{|P_i \cap T_i|}{|T_i|}, \quad
              F_1 = \frac{2 \mathrm{P} \mathrm{R}}{\mathrm{P} + \mathrm{R}}.

    Parameters
    ----------
    predicted, truth : array_like of int
        Cluster labels of the same mentions.

    Returns
    -------
    tuple of float
        ``(precision, recall, f1)``.
    """
    predicted = np.asarray(predicted)
    truth = np.asarray(truth)
    if predicted.shape != truth.shape or predicted.ndim != 1 or len(truth) == 0:
        raise ValueError("predicted and truth must be 1-D label arrays of the same length")
    _, p = np.unique(predicted, return_inverse=True)
    _, t = np.unique(truth, return_inverse=True)
    pair, n_pt = np.unique(p.astype(np.int64) * (t.max() + 1) + t, return_inverse=True)
    overlap = np.bincount(n_pt)[n_pt]  # |P_i ∩ T_i| for each mention
    prec = float(np.mean(overlap / np.bincount(p)[p]))
    rec = float(np.mean(overlap / np.bincount(t)[t]))
    return prec, rec, 2 * prec * rec / (prec + rec)


@dataclass(frozen=True)
class Mentions:
    """Author mentions with their entity labels.

    Attributes
    ----------
    first, middle, last, affiliation : list of str
        Name fields (``first`` may be an initial; ``middle`` may be ``""``)
        and affiliation, one per mention.
    topics : list of frozenset of str
        Topic words of the paper the mention comes from.
    year : numpy.ndarray
        Publication year.
    entity : numpy.ndarray
        True author of each mention.
    block : numpy.ndarray
        Block (ambiguous name: last name and first initial) of each mention.
    """

    first: list[str]
    middle: list[str]
    last: list[str]
    affiliation: list[str]
    topics: list[frozenset[str]]
    year: np.ndarray
    entity: np.ndarray
    block: np.ndarray

    def __len__(self) -> int:
        return len(self.entity)


_SYLLABLES = (
    "ka ro mi ta le su na vo ri de an el is ol ur be co fa gi ho ju ke li "
    "mo ne pa qu sa ti ve wy xa zo ar en"
).split()


def _word(rng: np.random.Generator, n_syll: int) -> str:
    return "".join(rng.choice(_SYLLABLES, n_syll))


def _typo(s: str, rng: np.random.Generator) -> str:
    if len(s) < 2:
        return s
    k = int(rng.integers(len(s)))
    return s[:k] + "abcdefghijklmnopqrstuvwxyz"[int(rng.integers(26))] + s[k + 1 :]


def power_law_mentions(
    n_blocks: int = 4,
    entities_per_block: int = 20,
    *,
    exponent: float = 1.7,
    max_size: int = 1000,
    largest: int | None = None,
    typo: float = 0.1,
    rng: np.random.Generator | int | None = None,
) -> Mentions:
    r"""Generate author mentions whose cluster sizes follow a power law.

    Each block is one ambiguous name: its entities share a last name and a
    first initial. Entity :math:`e` has a full first name, a middle initial
    (or none), a main and two secondary affiliations, six topic words and a
    career start; its number of mentions is
    :math:`\min(\lfloor U^{-1/(a-1)} \rfloor, S)` with :math:`U` uniform,
    :math:`a` = ``exponent`` and :math:`S` = ``max_size`` (a discrete Pareto
    tail, :math:`P(s) \propto s^{-a}`). A mention copies its entity's fields
    with noise: the first name is reduced to its initial with probability
    1/2 and the middle initial dropped with probability 1/2; names get a
    one-letter typo with probability ``typo``; the affiliation is the main one
    (0.7), a secondary one (0.2) or another entity's (0.1); the topic words are
    three of the entity's six and one drawn from the vocabulary; the year is
    the career start plus 0–14.

    Parameters
    ----------
    n_blocks : int
        Number of ambiguous names.
    entities_per_block : int
        Authors sharing each name.
    exponent : float
        Power-law exponent :math:`a > 1`.
    max_size : int
        Largest number of mentions of one entity.
    largest : int, optional
        When given, the first entity of each block gets exactly this many
        mentions (to guarantee a cluster of that size).
    typo : float
        Probability of a typo in each name field.
    rng : numpy.random.Generator or int, optional
        Source of randomness.

    Returns
    -------
    Mentions
    """
    if not exponent > 1:
        raise ValueError(f"exponent must be > 1 for a normalizable power law, got {exponent}")
    if n_blocks < 1 or entities_per_block < 1 or max_size < 1:
        raise ValueError("n_blocks, entities_per_block and max_size must be >= 1")
    rng = np.random.default_rng(rng)
    vocab = [_word(rng, 3) for _ in range(300)]
    affiliations = [f"univ {_word(rng, 3)}" for _ in range(60)]
    cols: dict[str, list] = {k: [] for k in ("first", "middle", "last", "affil", "topics")}
    years, entities, blocks = [], [], []
    e_id = 0
    for b in range(n_blocks):
        last = _word(rng, 3)
        initial = "abcdefghijklmnoprstvw"[int(rng.integers(21))]
        sizes = np.minimum((rng.random(entities_per_block) ** (-1.0 / (exponent - 1))), max_size)
        sizes = sizes.astype(np.int64)
        if largest is not None:
            sizes[0] = int(largest)
        for size in sizes:
            first = initial + _word(rng, 2)
            middle = "" if rng.random() < 0.3 else "abcdefghijklmnopqrstuvwxyz"[rng.integers(26)]
            affil = rng.choice(affiliations, 3, replace=False)
            topics = rng.choice(vocab, 6, replace=False)
            start = int(rng.integers(1970, 2005))
            for _ in range(int(size)):
                f = first if rng.random() < 0.5 else initial
                cols["first"].append(_typo(f, rng) if rng.random() < typo and len(f) > 1 else f)
                cols["middle"].append(middle if rng.random() < 0.5 else "")
                cols["last"].append(_typo(last, rng) if rng.random() < typo else last)
                u = rng.random()
                a = affil[0] if u < 0.7 else affil[1 + int(u > 0.8)]
                if u > 0.9:
                    a = affiliations[int(rng.integers(len(affiliations)))]
                cols["affil"].append(a)
                words = set(rng.choice(topics, 3, replace=False).tolist())
                words.add(vocab[int(rng.integers(len(vocab)))])
                cols["topics"].append(frozenset(words))
                years.append(start + int(rng.integers(15)))
                entities.append(e_id)
                blocks.append(b)
            e_id += 1
    return Mentions(
        cols["first"],
        cols["middle"],
        cols["last"],
        cols["affil"],
        cols["topics"],
        np.asarray(years, dtype=float),
        np.asarray(entities, dtype=np.int64),
        np.asarray(blocks, dtype=np.int64),
    )


def _jaro_winkler():
    try:
        import jellyfish
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError(
            "mention_pair_features needs the jellyfish package: pip install jellyfish "
            "(or pip install 'pymc-subsample[examples]')"
        ) from err
    return jellyfish.jaro_winkler_similarity


def mention_pair_features(mentions: Mentions, i: int, js) -> np.ndarray:
    r"""Compare mention ``i`` with each mention of ``js``, field by field.

    Columns (:data:`FEATURE_NAMES`): Jaro–Winkler similarity of the first
    names (1 when either is an initial equal to the other's first letter, 0 if
    the letters differ); whether either first name is an initial; middle
    initials (+1 equal, −1 different, 0 if one is missing); Jaro–Winkler of
    the last names and of the affiliations; Jaccard overlap of the topic
    words; year gap / 10. Cheap per pair, like the string features of Singh
    et al. (2012).

    Parameters
    ----------
    mentions : Mentions
        The mentions.
    i : int
        One mention.
    js : array_like of int
        Others.

    Returns
    -------
    numpy.ndarray
        Shape ``(len(js), 7)``.
    """
    jw = _jaro_winkler()
    js = np.asarray(js, dtype=np.int64)
    out = np.empty((len(js), len(FEATURE_NAMES)))
    fi, mi, li, ai, ti = (
        mentions.first[i],
        mentions.middle[i],
        mentions.last[i],
        mentions.affiliation[i],
        mentions.topics[i],
    )
    for row, j in enumerate(js.tolist()):
        fj = mentions.first[j]
        if len(fi) == 1 or len(fj) == 1:
            out[row, 0] = float(fi[0] == fj[0])
            out[row, 1] = 1.0
        else:
            out[row, 0] = jw(fi, fj)
            out[row, 1] = 0.0
        mj = mentions.middle[j]
        out[row, 2] = 0.0 if not (mi and mj) else (1.0 if mi == mj else -1.0)
        out[row, 3] = jw(li, mentions.last[j])
        out[row, 4] = jw(ai, mentions.affiliation[j])
        tj = mentions.topics[j]
        out[row, 5] = len(ti & tj) / len(ti | tj)
    out[:, 6] = np.abs(mentions.year[js] - mentions.year[i]) / 10.0
    return out


def sample_block_pairs(
    block, n_pairs: int, rng: np.random.Generator | int | None = None
) -> np.ndarray:
    """Draw ``n_pairs`` random pairs ``(i, j)``, ``i != j``, of items of the same block.

    Parameters
    ----------
    block : array_like of int
        Block of each item.
    n_pairs : int
        Number of pairs.
    rng : numpy.random.Generator or int, optional
        Source of randomness.

    Returns
    -------
    numpy.ndarray
        int64 array of shape ``(n_pairs, 2)``.
    """
    rng = np.random.default_rng(rng)
    block = np.asarray(block)
    order = np.argsort(block, kind="stable")
    _, start, count = np.unique(block[order], return_index=True, return_counts=True)
    ok = count >= 2
    start, count = start[ok], count[ok]
    if len(count) == 0:
        raise ValueError("no block has two items: there are no within-block pairs")
    weights = count * (count - 1.0)
    b = rng.choice(len(count), n_pairs, p=weights / weights.sum())
    a = rng.integers(0, count[b])
    c = rng.integers(0, count[b] - 1)
    c += c >= a
    return np.stack([order[start[b] + a], order[start[b] + c]], axis=1)


def fit_pair_logistic(features: np.ndarray, same: np.ndarray, l2: float = 1e-3) -> np.ndarray:
    r"""Fit :math:`\theta` by L2-penalized logistic regression of coreference on pair features.

    Minimizes :math:`-\sum_k [s_k \log \sigma(z_k) + (1 - s_k)\log(1-\sigma(z_k))]
    + \tfrac{\lambda}{2} n \|\theta_{1:}\|^2`, :math:`z_k = \theta_0 +
    \theta_{1:}^\top \phi_k`, by L-BFGS. With pairs drawn uniformly within
    blocks, :math:`z` estimates the log-odds that a pair of the same block
    corefers, which is the log factor :math:`w` of the clustering model.

    Parameters
    ----------
    features : numpy.ndarray
        Shape ``(n, F)``.
    same : numpy.ndarray
        ``n`` booleans: whether each pair corefers.
    l2 : float
        :math:`\lambda \ge 0`.

    Returns
    -------
    numpy.ndarray
        :math:`\theta`, shape ``(F + 1,)``, intercept first.
    """
    x = np.column_stack([np.ones(len(features)), np.asarray(features, dtype=float)])
    y = np.asarray(same, dtype=float)
    if x.shape[0] != y.shape[0] or y.ndim != 1:
        raise ValueError("features and same must have one row per pair")
    if y.min() == y.max():
        raise ValueError("same must contain both coreferent and non-coreferent pairs")
    n = len(y)

    def loss(theta):
        z = x @ theta
        nll = np.sum(np.logaddexp(0.0, z) - y * z)
        grad = x.T @ (1.0 / (1.0 + np.exp(-z)) - y)
        pen = 0.5 * l2 * n * theta[1:] @ theta[1:]
        grad[1:] += l2 * n * theta[1:]
        return (nll + pen) / n, grad / n

    res = optimize.minimize(loss, np.zeros(x.shape[1]), jac=True, method="L-BFGS-B")
    return res.x


def pair_log_odds(theta: np.ndarray, features: np.ndarray) -> np.ndarray:
    r"""Log factor :math:`w = \theta_0 + \theta_{1:}^\top \phi` of each row of ``features``."""
    return theta[0] + np.asarray(features) @ theta[1:]
