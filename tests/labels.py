"""Reading the console as a user does: a label's rank set back as numbers (``0-3,5`` -> [0, 1, 2, 3, 5])."""


def expand(text: str) -> list[int] | None:
    """The inverse of ``xrun.common.output.dedupe.compact``; None when ``text`` is not such a list."""
    ranks: list[int] = []
    for part in text.split(","):
        low, sep, high = part.partition("-")
        if not low.isdigit() or (sep and not high.isdigit()):
            return None
        first, last = int(low), int(high) if sep else int(low)
        if last < first or last - first > 1 << 17:
            return None
        ranks.extend(range(first, last + 1))
    return ranks
