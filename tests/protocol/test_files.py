"""Reading the end of a large log: only its last bytes, whole lines, missing files as empty."""
from __future__ import annotations

from trainer_core.protocol import files


def test_read_end_returns_the_last_bytes_and_replaces_undecodable_ones(tmp_path):
    path = tmp_path / "worker.log"
    path.write_bytes(b"x" * 100_000 + b"\xff end")
    assert files.read_end(path, 5) == "\ufffd end"
    assert len(files.read_end(path, 1000)) == 1000
    assert files.read_end(tmp_path / "missing.log", 10) == ""


def test_tail_lines_reads_only_the_end_of_the_file(tmp_path):
    path = tmp_path / "rank.log"
    path.write_text("".join(f"line {i}\n" for i in range(200_000)))
    assert files.tail_lines(path, 3) == ["line 199997", "line 199998", "line 199999"]
    # from a 64-byte end the first (partial) line is cut; only whole lines are asked for here
    assert files.tail_lines(path, 2, max_bytes=64) == ["line 199998", "line 199999"]
    assert files.tail_lines(path, 0) == []
    assert files.tail_lines(tmp_path / "missing.log", 5) == []
