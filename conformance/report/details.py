"""Cross-rank messages: each distinct message once, with the ranks that reported it.

Ranks of one case often fail the same way; a report names the failure once ("ranks 0-3: ...")
and lists a different failure separately, as hypothesis reports each distinct failure once.
"""

from __future__ import annotations

from collections.abc import Iterable


def rank_span(ranks: Iterable[int]) -> str:
    """``rank 2``, ``ranks 0, 1``, ``ranks 0-3, 6``: runs of three or more ranks as a range."""
    ordered = sorted(set(ranks))
    runs: list[list[int]] = []
    for r in ordered:
        if runs and r == runs[-1][-1] + 1:
            runs[-1].append(r)
        else:
            runs.append([r])
    parts = [f"{run[0]}-{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs]
    return f"{'rank' if len(ordered) == 1 else 'ranks'} {', '.join(parts)}"


def distinct_details(details: Iterable[tuple[int, str]]) -> list[str]:
    """One entry per distinct message of (rank, message) pairs, in order of first appearance.

    A message that starts with its own rank (``rank N: ...``, ``rank N raised: ...``) is grouped by what
    follows and names every rank that reported it (``ranks 0-3 raised: ...``); any other message is kept
    as is, once.
    """
    groups: dict[tuple[bool, str], list[int]] = {}
    for rank, text in details:
        if not text:
            continue
        own = f"rank {rank}"
        prefixed = text.startswith(own) and text[len(own):len(own) + 1] in (":", " ")
        groups.setdefault((prefixed, text[len(own):] if prefixed else text), []).append(rank)
    return [f"{rank_span(ranks)}{body}" if prefixed else body for (prefixed, body), ranks in groups.items()]


def merge_details(details: Iterable[tuple[int, str]]) -> str:
    """The distinct messages of (rank, message) pairs, joined with ``"; "``."""
    return "; ".join(distinct_details(details))
