"""Issue 26, the JupyterLab Jobs panel's server half (``jupyterlab_gpulab/jobs.py``): a job's log
read in pieces never shows a broken character, whatever way the hub answers, and the file's
folder is sent as the hub expects it (relative to the home)."""

from __future__ import annotations

import json

from jupyterlab_gpulab.jobs import home_relative, log_chunk, whole_utf8

TEXT = "loss 0.5 \u2192 0.25 \U0001f680 done\n".encode()


def test_a_character_cut_by_a_read_waits_for_the_next_one() -> None:
    for cut in range(len(TEXT) + 1):
        head = TEXT[:cut]
        keep = whole_utf8(head)
        assert keep <= cut and cut - keep <= 3
        TEXT[:keep].decode()  # whole characters only: this must not raise
        # The two reads together are the text, each decoded on its own.
        first = log_chunk(200, {"Content-Type": "text/plain"}, head, 0)[0]
        second = log_chunk(200, {}, TEXT[first["next_offset"] :], first["next_offset"])[0]
        assert "\ufffd" not in first["text"] + second["text"]
        assert (first["text"] + second["text"]).encode() == TEXT


def test_the_hubs_json_and_refusals_pass_as_they_are() -> None:
    body = json.dumps({"data": "step 3\n", "next_offset": 42, "done": True}).encode()
    chunk, status = log_chunk(200, {"Content-Type": "application/json"}, body, 35)
    assert status == 200 and chunk == {
        "text": "step 3\n",
        "offset": 35,
        "next_offset": 42,
        "done": True,
    }
    # The hub's bytes, with where they end and the job's state in headers.
    headers = {"X-Gpulab-Log-Offset": "9", "X-Gpulab-Job-State": "running"}
    chunk, _ = log_chunk(200, headers, b"abc", 6)
    assert chunk == {"text": "abc", "offset": 6, "next_offset": 9, "done": False}
    headers["X-Gpulab-Job-State"] = "failed"
    assert log_chunk(200, headers, b"abc", 6)[0]["done"] is True
    # Another user's job is a 404 from the hub: the panel gets the hub's message, not the log.
    chunk, status = log_chunk(404, {}, b'{"status": 404, "message": "no job 7"}', 0)
    assert (status, chunk) == (404, {"message": "no job 7"})


def test_the_files_folder_is_relative_to_the_home(tmp_path) -> None:
    home = tmp_path / "home"
    (home / "work" / "p").mkdir(parents=True)
    # gpulab starts servers in the home: the folder is unchanged.
    assert home_relative("work/p", str(home), str(home)) == "work/p"
    # A server rooted below the home: the folder as seen from the home.
    assert home_relative("p", str(home / "work"), str(home)) == "work/p"
    assert home_relative("", str(home / "work"), str(home)) == ""
    # Not under the home: left for the hub to refuse, naming cwd.
    assert home_relative("x", str(tmp_path), str(home)) == "x"
