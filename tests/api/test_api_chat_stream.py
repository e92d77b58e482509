"""A streamed chat answer relayed with the asked model's name in every chunk, whatever way the bytes arrive."""
from __future__ import annotations

import json

from trainer_core.api.chat import StreamRenamer


def test_each_chunk_names_the_asked_model_even_when_a_line_is_split_across_reads():
    chunks = [{"id": "c1", "object": "chat.completion.chunk", "model": "served-model", "choices": [{"delta": {
        "content": word}}]} for word in ("Ahoy", " matey", " ☠")]
    stream = b"".join(f"data: {json.dumps(c)}\r\n\r\n".encode() for c in chunks) + b": keep-alive\n\ndata: [DONE]\n\n"
    renamer = StreamRenamer("ft:smollm2-135m-instruct:pirate:ftjob-1")
    out = b"".join(renamer.feed(stream[i:i + 7]) for i in range(0, len(stream), 7)) + renamer.close()
    renamed = [{**c, "model": "ft:smollm2-135m-instruct:pirate:ftjob-1"} for c in chunks]
    assert out == b"".join(f"data: {json.dumps(c, ensure_ascii=False)}\r\n\r\n".encode() for c in renamed) \
        + b": keep-alive\n\ndata: [DONE]\n\n"  # the rest unchanged, line ends kept
    assert StreamRenamer("m").feed(b'data: {"model": "x"}') == b"" and StreamRenamer("m").close() == b""
