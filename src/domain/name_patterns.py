"""Shell-style model-name patterns (`fnmatch.fnmatchcase`) and whether two can match one name.

Two patterns overlap when some name matches both. That is decided exactly, not guessed:
each pattern is a sequence of tokens (`*`, or one character from a set), and a name both
match exists iff the pair of patterns can be walked to their ends together, `*` consuming
any number of the other side's characters. The walk also builds such a name (a witness),
which is checked with `fnmatchcase` itself before it is reported.
"""

from __future__ import annotations

from collections import deque
from fnmatch import fnmatchcase

_MAX_CHAR = 0x10FFFF
_STAR = None


class CharSet:
    """The characters one non-`*` token matches: ranges, possibly complemented."""

    __slots__ = ("negated", "ranges")

    def __init__(self, ranges: tuple[tuple[int, int], ...], negated: bool = False) -> None:
        self.ranges = tuple(r for r in ranges if r[0] <= r[1])  # `[z-a]` matches nothing
        self.negated = negated

    def __contains__(self, code: int) -> bool:
        inside = any(lo <= code <= hi for lo, hi in self.ranges)
        return inside != self.negated

    def common(self, other: CharSet) -> int | None:
        """A character both sets match, or None."""
        candidates = [ord("a")]
        for lo, hi in (*self.ranges, *other.ranges):
            candidates += (lo, hi, lo - 1, hi + 1)
        for code in sorted(set(candidates)):
            if 0 <= code <= _MAX_CHAR and code in self and code in other:
                return code
        return None


Token = CharSet | None  # None: `*`


def tokens(pattern: str) -> list[Token]:
    """`pattern` as fnmatch reads it: `*`, `?`, `[...]` / `[!...]` with ranges, else literals.

    An unclosed `[` is a literal `[`, as in `fnmatch.translate`.
    """
    out: list[Token] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            if not out or out[-1] is not _STAR:
                out.append(_STAR)
        elif c == "?":
            out.append(CharSet((), negated=True))
        elif c == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                out.append(CharSet(((ord("["), ord("[")),)))
                continue
            body, i = pattern[i:j], j + 1
            negated = body.startswith("!")
            if negated:
                body = body[1:]
            out.append(CharSet(_ranges(body), negated))
        else:
            out.append(CharSet(((ord(c), ord(c)),)))
    return out


def _ranges(body: str) -> tuple[tuple[int, int], ...]:
    ranges: list[tuple[int, int]] = []
    k = 0
    while k < len(body):
        if k + 2 < len(body) and body[k + 1] == "-":
            ranges.append((ord(body[k]), ord(body[k + 2])))
            k += 3
        else:
            ranges.append((ord(body[k]), ord(body[k])))
            k += 1
    return tuple(ranges)


def common_name(a: str, b: str) -> str | None:
    """A name matched by both patterns (checked with `fnmatchcase`), or None if there is none."""
    ta, tb = tokens(a), tokens(b)
    start, end = (0, 0), (len(ta), len(tb))
    came: dict[tuple[int, int], tuple[tuple[int, int], str]] = {start: (start, "")}
    todo = deque([start])
    while todo:
        i, j = state = todo.popleft()
        if state == end:
            break
        x = ta[i] if i < len(ta) else False
        y = tb[j] if j < len(tb) else False
        steps: list[tuple[tuple[int, int], str]] = []
        if x is _STAR:
            steps.append(((i + 1, j), ""))  # the star is done
            if isinstance(y, CharSet) and (code := y.common(CharSet((), negated=True))) is not None:
                steps.append(((i, j + 1), chr(code)))  # the star eats b's character
        if y is _STAR:
            steps.append(((i, j + 1), ""))
            if isinstance(x, CharSet) and (code := x.common(CharSet((), negated=True))) is not None:
                steps.append(((i + 1, j), chr(code)))
        if isinstance(x, CharSet) and isinstance(y, CharSet) and (code := x.common(y)) is not None:
            steps.append(((i + 1, j + 1), chr(code)))
        for nxt, char in steps:
            if nxt not in came:
                came[nxt] = (state, char)
                todo.append(nxt)
    return _witness(came, start, end, a, b) if end in came else None


def _witness(
    came: dict[tuple[int, int], tuple[tuple[int, int], str]], start: tuple[int, int], end: tuple[int, int],
    a: str, b: str,
) -> str | None:
    chars: list[str] = []
    state = end
    while state != start:
        previous, char = came[state]
        chars.append(char)
        state = previous
    name = "".join(reversed(chars))
    return name if fnmatchcase(name, a) and fnmatchcase(name, b) else None
