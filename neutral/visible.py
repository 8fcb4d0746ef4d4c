"""Job data with every control character shown instead of obeyed: the one rule for what a
CLI, a prompt or a path may put before a person (the terminal's `jobs show`, the dashboard).

An escape sequence in job data would act on a terminal (set its title, clear the screen,
write the clipboard with OSC 52); on a page it is noise, or hides text. So C0 is shown in
caret notation (`^[`), DEL as `^?`, C1 (U+0080-U+009F, such as the one-character CSI U+009B)
and a byte that is not UTF-8 as `<9b>`, bidi overrides as `<U+202E>` (Trojan Source), as
`less` and `git` do. Newlines and tabs are kept.
"""

from __future__ import annotations


def _visible_table() -> dict[int, str]:
    table = {c: "^" + chr(c + 64) for c in range(0x20) if chr(c) not in "\n\t"}
    table[0x7F] = "^?"
    table.update({c: f"<{c:02x}>" for c in range(0x80, 0xA0)})  # C1, the CSI U+009B too
    # Undecodable bytes (surrogateescape) are shown as the byte they were.
    table.update({c: f"<{c - 0xDC00:02x}>" for c in range(0xDC80, 0xDD00)})
    # Bidi overrides and isolates reorder what the eye reads (Trojan Source).
    table.update({c: f"<U+{c:04X}>" for c in [*range(0x202A, 0x202F), *range(0x2066, 0x206A),
                                               0x200E, 0x200F, 0x061C, 0x2028, 0x2029]})
    return table


_VISIBLE = _visible_table()


def visible(text: str) -> str:
    """Job data with every control character shown instead of obeyed (newlines and tabs
    kept): the one rule for what reaches the operator's terminal."""
    return text.translate(_VISIBLE)
