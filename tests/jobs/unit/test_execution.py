"""The final stdout as the row stores it (`final_stdout`): the spool file read in bounded
passes, stored as valid UTF-8, and a plain-text answer found as a range of it."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from gateway.jobs import execution
from gateway.jobs.execution import final_stdout
from gateway.jobs.run.spool import CLEAN_STDOUT_NAME
from providers.parsing import decode, plain_text

PIECES = [b"a", b"Z", b" ", b"\n", b"\t", b"\r", "é".encode(), "€".encode(), "𝄞".encode(),
          "\u3000".encode(), "\u00a0".encode(), "\u2028".encode(), b"\xff", b"\xe2\x82"]
EDGES = [b"", b"\n\n", b"answer", b"\n\n answer \n\n", b"  lead\n", b"\n \t\n\r",
         "añ€𝄞\u3000\n".encode(), b"bad \xff\xfe byte\n", b"\xe2\x82", b"\n\xe2\x82"]


def inputs() -> list[bytes]:
    rng = random.Random("final-stdout")
    made = [b"".join(rng.choice(PIECES) for _ in range(rng.randrange(1, 40))) for _ in range(150)]
    return EDGES + made


@pytest.mark.parametrize("chunk_bytes", [1, 2, 5, 4096])
def test_the_stored_output_is_the_decoded_stdout_and_the_answer_a_range_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_bytes: int,
) -> None:
    monkeypatch.setattr(execution, "OUTPUT_CHUNK_BYTES", chunk_bytes)  # reads cut characters
    spool = tmp_path / "stdout"
    for data in inputs():
        spool.write_bytes(data)
        (tmp_path / CLEAN_STDOUT_NAME).unlink(missing_ok=True)
        final = final_stdout(spool, plain_answer=True)
        stored = final.file.path.read_bytes()
        assert stored == decode(data).encode() and final.file.size == len(stored), data
        valid = stored == data
        assert (final.file.path == spool) is valid, data  # a copy only when not UTF-8
        assert not final.escape
        answer = plain_text(data)
        if final.answer_span is None:
            assert answer == "", data
        else:
            start, end = final.answer_span
            assert stored[start:end].decode() == answer != "", data


def test_without_a_plain_text_answer_only_the_encoding_is_checked(tmp_path: Path) -> None:
    spool = tmp_path / "stdout"
    spool.write_bytes(b'{"type": "result"}\n')
    final = final_stdout(spool, plain_answer=False)
    assert (final.file.path, final.file.size, final.answer_span) == (spool, 19, None)
    spool.write_bytes(b"\xff")
    assert final_stdout(spool, plain_answer=False).file.path.read_bytes() == "\ufffd".encode()


def test_ansi_codes_make_the_plain_answer_no_range_of_the_output(tmp_path: Path) -> None:
    spool = tmp_path / "stdout"
    spool.write_bytes(b"\x1b[1mAll done\x1b[0m\n")
    final = final_stdout(spool, plain_answer=True)
    assert final.escape and final.answer_span is None  # the caller keeps the text instead


def test_a_missing_spool_file_is_an_empty_output(tmp_path: Path) -> None:
    final = final_stdout(tmp_path / "stdout", plain_answer=True)
    assert (final.file.size, final.answer_span) == (0, None)
