"""worker.log is bounded (issue 31: a chatty reward wrote 184 MB in 12 steps): the worker keeps the head and the
newest tail of its output, says in the log what it left out, and still redacts secrets. The worker's fd 1 and 2 are
the file the launcher opened; the cap is taken on the worker's side (trainer_core/worker/bounded_log.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support import ROOT
from trainer_core.protocol.status import JobKind, write_kind

HEAD, TAIL = 2000, 3000
CHATTY = f"""
import os, sys
from trainer_core.worker import bounded_log
out = bounded_log.BoundedOutput(["s3cret-token"], head_bytes={HEAD}, tail_bytes={TAIL})
for i in range(20000):
    print(f"step {{i}} with s3cret-token in it")
sys.stdout.write("no newline " * 100000)  # a reward printing without a newline, 1.1 MB
sys.stdout.flush()
os.write(2, b"the last line, from fd 2\\n")
out.close()
print("after close", flush=True)
"""


def run_child(script: str, log: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    with open(log, "ab") as out:  # as the launcher opens worker.log
        return subprocess.run([sys.executable, "-c", script], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                              env=env, timeout=300, check=False)


def test_a_chatty_worker_keeps_the_head_and_the_newest_tail_and_says_what_it_left_out(tmp_path):
    log = tmp_path / "worker.log"
    done = run_child(CHATTY, log)
    assert done.returncode == 0, log.read_text()[-2000:]
    text = log.read_text()
    assert len(text.encode()) <= HEAD + 2 * TAIL + 1000  # the two notes below are the 1000
    assert text.startswith("step 0 with *** in it\nstep 1 with *** in it\n")
    assert "s3cret-token" not in text
    head, rest = text.split("\n---- worker.log is capped", 1)
    assert len(head.encode()) <= HEAD and head.endswith(" in it\n")  # cut at a line's end
    assert rest.startswith(": it keeps the first 2000 bytes of the worker's output and the newest 3000 to 6000; "
                           "what lies between is left out, and counted below ----\n")
    assert "bytes of output left out here ----\n" in rest
    assert rest.endswith("no newline the last line, from fd 2\nafter close\n")


def test_a_torchrun_ranks_file_only_grows_and_gets_its_newest_output_at_the_end(tmp_path):
    # torchrun tails a rank's file into worker.log from its offset: a file cut back would go silent
    log = tmp_path / "rank.log"
    script = CHATTY.replace("tail_bytes={TAIL})".format(TAIL=TAIL), f"tail_bytes={TAIL}, trim=False)")
    assert "trim=False" in script
    assert run_child(script, log).returncode == 0
    text = log.read_text()
    assert len(text.encode()) <= HEAD + TAIL + 1000 and text.startswith("step 0 with *** in it\n")
    head, rest = text.split("\n---- worker.log is capped", 1)
    assert rest.startswith(": it keeps the first 2000 bytes of the worker's output and the newest 3000, written when "
                           "the worker ends; what lies between is left out, and counted below ----\n")
    lines = rest.splitlines()
    assert lines[1].startswith("---- ") and lines[1].endswith(" bytes of output left out here ----")
    left_out = int(lines[1].split()[1].replace(",", ""))
    written = sum(len(f"step {i} with *** in it\n") for i in range(20000)) + len("no newline " * 100000) + 25
    assert left_out == written - len(head.encode()) - TAIL
    assert rest.endswith("no newline the last line, from fd 2\nafter close\n")


def test_a_short_log_is_left_as_it_is(tmp_path):
    log = tmp_path / "worker.log"
    script = ("from trainer_core.worker import bounded_log\nout = bounded_log.BoundedOutput([])\n"
              "print('hello', flush=True)\nout.close()\n")
    assert run_child(script, log).returncode == 0
    assert log.read_text() == "hello\n"


FAKE_ENTRY = """
from pathlib import Path

def main(run_dir: Path) -> int:
    for i in range(50000):
        print(f"reward says {i}")
    return 0
"""


def test_the_worker_caps_its_log_for_every_job(tmp_path):
    (tmp_path / "fake_entry.py").write_text(FAKE_ENTRY)
    home = tmp_path / "home"
    env = {"PATH": "/usr/bin:/bin", "FINETUNE_STUDIO_HOME": str(home), "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    script = ("import sys\nfrom trainer_core.worker import ENTRY_POINTS, bounded_log\n"
              "from trainer_core.protocol.status import JobKind\nfrom trainer_core.worker.__main__ import main\n"
              "bounded_log.HEAD_BYTES, bounded_log.TAIL_BYTES = 4000, 4000\n"
              "ENTRY_POINTS[JobKind.EVAL] = 'fake_entry'\nsys.exit(main(['worker', sys.argv[1]]))\n")
    run_dir = home / "runs" / "20260101-120000-abc123"  # paths.run_dir under the child's FINETUNE_STUDIO_HOME
    run_dir.mkdir(parents=True)
    write_kind(run_dir, JobKind.EVAL)
    log = run_dir / "worker.log"
    with open(log, "ab") as out:
        done = subprocess.run([sys.executable, "-c", script, str(run_dir)], cwd=ROOT, stdout=out,
                              stderr=subprocess.STDOUT, env=env, timeout=300, check=False)
    text = log.read_text()
    assert done.returncode == 0, text[-2000:]
    assert len(text.encode()) <= 4000 + 2 * 4000 + 1000
    assert text.startswith("reward says 0\n") and text.endswith("reward says 49999\n")
    assert "\n---- worker.log is capped: it keeps the first 4000 bytes" in text
