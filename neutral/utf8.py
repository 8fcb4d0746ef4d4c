"""Where UTF-8 bytes may be cut: spool tails, result pages, diff pages and `Stdout.tail` all
cut at a character boundary found here, so no page ends in half a character."""

from __future__ import annotations

# A UTF-8 character is one lead byte and at most 3 continuation bytes (10xxxxxx): no character
# boundary is further than this from any byte of valid UTF-8.
UTF8_MAX_CONTINUATION = 3


def char_boundary(data: bytes, index: int, *, forward: bool = False) -> int:
    """Where a cut of `data` near `index` keeps every UTF-8 character whole: `index` itself
    unless it falls inside a character, else that character's start (forward: the next
    character's start). The one home of this rule: spool tails, result pages and `Stdout.tail`
    all cut here.

    Never moves past either end of `data` (a window whose first bytes continue a character
    cut off before it moves forward, never back) and by at most UTF8_MAX_CONTINUATION bytes:
    bytes that are not UTF-8 have no boundary to find and decode as U+FFFD.
    """
    step = 1 if forward else -1
    for _ in range(UTF8_MAX_CONTINUATION):
        if not 0 <= index < len(data) or data[index] & 0xC0 != 0x80:
            break
        if index == 0 and not forward:
            break
        index += step
    return index
