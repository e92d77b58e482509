"""`chat RUN --image PATH` (issue 20): the image goes with the first message as a data: URL image part, within the
serve gate's limits and from under the allowed folders; a bad file is named before any server starts."""
from __future__ import annotations

import base64

import pytest
from PIL import Image

from tests.serving.test_serve_job import cli_runs  # noqa: F401 - a fixture
from trainer_core import __main__ as cli
from trainer_core.protocol.status import JobKind
from trainer_core.cli.serve import CliError, image_message


def png(path, size=(8, 8)):
    Image.new("RGB", size, "red").save(path)
    return path


def test_the_image_is_a_data_url_part_before_the_text(home, tmp_path):
    picture = png(tmp_path / "red.png")
    message = image_message("What colour is this?", str(picture))
    image, text = message["content"]
    assert message["role"] == "user" and text == {"type": "text", "text": "What colour is this?"}
    url = image["image_url"]["url"]
    assert url.startswith("data:image/png;base64,") and base64.b64decode(url.split(",", 1)[1]) == picture.read_bytes()


@pytest.mark.parametrize("case, make, words", [
    ("outside the allowed folders", lambda d: png(d.parent / f"{d.name}-outside.png"), "allowed folder"),
    ("not a file", lambda d: d, "is not a file"),
    ("not an image", lambda d: (d / "notes.png").write_text("hello") and d / "notes.png", "is not an image"),
    ("too many pixels", lambda d: png(d / "huge.png", (5000, 4000)), "pixels"),
])
def test_a_bad_image_is_named_before_any_server_starts(cli_runs, tmp_path, capsys, case, make, words):
    path = make(tmp_path)
    try:
        assert cli.main(["chat", "done", "--prompt", "hi", "--image", str(path)]) == 2, case
        err = capsys.readouterr().err
        assert err.startswith("error: --image") and words in err, (case, err)
        assert "Traceback" not in err
        assert {r.kind for r in cli_runs.list_runs()} == {JobKind.TRAIN}  # no serve job was recorded
    finally:
        if path.name.endswith("-outside.png"):
            path.unlink()


def test_image_message_raises_cli_errors_not_tracebacks(home, tmp_path):
    with pytest.raises(CliError, match="is not a file"):
        image_message("hi", str(tmp_path / "missing.png"))
