"""Issue 26 in JupyterLab, in headless Chromium against a real hub (local spawner, the job scheduler,
the extension's server half relaying with the server's own token): the Jobs panel as a person
uses it.

Points of the issue this covers (each locator timed out on the extension before the panel):

- "a JupyterLab panel that submits the open script or notebook": with a script open, the
  command palette's "Run as job…" submits ``python FILE`` from the file's folder on the GPU type
  and cards chosen in its dialog; a notebook, from the file browser's context menu, is
  ``jupyter execute FILE`` (it runs: the file its cell writes appears next to it).
- "stdout/stderr streamed live and kept; status, cancel, exit code": the panel follows the job's
  log as it prints, says when it ended, and shows the state with the exit code; Cancel ends a
  running job.
- "a job needs no running server": the job keeps its own card and output after the JupyterLab
  server that submitted it has stopped.
- no console errors of gpulab's on the page. GPULAB_SCREENSHOTS=DIR keeps the pages as PNG files.
"""

from __future__ import annotations

import json
import os

import pytest
from browser_helpers import shot
from harness import PASSWORD, SLOW, Hub, approved_user, browser_log_in, wait_for, write_in_home

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="job servers run as users' accounts")

TRAIN = """import os, sys, time
print("cwd", os.getcwd(), flush=True)
for epoch in range(1, 5):
    print(f"epoch {epoch} loss {1 / epoch:.3f}", flush=True)
    time.sleep(1)
print("trained on", os.environ.get("CUDA_VISIBLE_DEVICES"), file=sys.stderr)
"""
CELL = "import os\nopen('nb-ran.txt', 'w').write(os.getcwd())\nprint('notebook ran')\n"


def notebook(source: str) -> str:
    return json.dumps(
        {
            "cells": [
                {
                    "cell_type": "code",
                    "execution_count": None,
                    "id": "c1",
                    "metadata": {},
                    "outputs": [],
                    "source": source,
                }
            ],
            "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )


@pytest.fixture(scope="module")
def lhub(module_hub_factory) -> Hub:
    return module_hub_factory(
        "labext-jobs",
        simulate="RTX-4090:1",
        extra_args=["--JobScheduler.interval=0.3", "--JobScheduler.retry_seconds=1"],
    )


def jobs_of(hub: Hub, user: str) -> list[dict]:
    r = hub.api("GET", f"/gpulab/users/{user}/jobs")
    assert r.status_code == 200, r.text
    return r.json()["jobs"]


def shown_as(panel, hub: Hub, user: str, job_id: int, state: str):
    """The panel's entry of job ``job_id`` once it shows ``state`` (on a timeout, the hub's own
    record of the job says why)."""
    entry = panel.locator(f".jp-gpulab-job[data-job='{job_id}'][data-state='{state}']")
    try:
        entry.wait_for(timeout=SLOW)
    except Exception:
        job = next((j for j in jobs_of(hub, user) if j["id"] == job_id), None)
        raise AssertionError(f"job {job_id} not shown {state}; the hub has {job}") from None
    return entry


def dialog_submit(page, gpu: str) -> None:
    """Choose ``gpu`` in the open "Run as job" dialog and submit (the panel says so once the
    hub has answered)."""
    dialog = page.locator(".jp-Dialog")
    dialog.locator(".jp-gpulab-job-gpu").wait_for(timeout=SLOW)
    dialog.locator(".jp-gpulab-job-gpu").select_option(gpu)
    shot(page, f"lab-jobs-dialog-{gpu}")
    answer = page.locator("#gpulab-jobs .jp-gpulab-jobs-answer")
    answer.evaluate("node => { node.textContent = ''; }")
    dialog.get_by_role("button", name="Submit job").click()
    dialog.wait_for(state="detached", timeout=SLOW)
    answer.filter(has_text="submitted").wait_for(timeout=SLOW)


def test_the_jobs_panel_runs_the_open_script_and_a_notebook(lhub: Hub, browser) -> None:
    hub = lhub
    name = approved_user(hub, "labjobs", PASSWORD)
    home = hub.data_dir / "users" / name
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on(
        "console",
        lambda m: m.type == "error" and "gpulab" in m.text.lower() and errors.append(m.text),
    )
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        browser_log_in(page, hub, name, PASSWORD, timeout=SLOW)
        hub.spawn_ready(name, {"gpu": "none"}, timeout=120)
        write_in_home(home, "work/train.py", TRAIN)
        write_in_home(home, "work/nb/analyse.ipynb", notebook(CELL))
        page.goto(hub.user_url(name, "lab/tree/work/train.py"), timeout=SLOW)
        page.locator(".jp-FileEditor .cm-content", has_text="trained on").wait_for(timeout=SLOW)

        # The open script, from the command palette, on the RTX 4090.
        page.keyboard.press("Control+Shift+C")
        page.locator(".lm-CommandPalette-input").fill("Run as job")
        page.locator(".lm-CommandPalette-item", has_text="Run as job").first.click()
        dialog = page.locator(".jp-Dialog")
        dialog.get_by_text("Runs in ~/work").wait_for(timeout=SLOW)
        assert dialog.locator(".jp-gpulab-job-command").input_value() == "python train.py"
        dialog_submit(page, "rtx-4090")
        (job,) = jobs_of(hub, name)
        assert (job["command"], job["cwd"], job["gpu"], job["gpus"]) == (
            "python train.py",
            "work",
            "rtx-4090",
            1,
        )
        panel = page.locator("#gpulab-jobs")
        panel.locator(f".jp-gpulab-job[data-job='{job['id']}']").wait_for(timeout=SLOW)
        log = panel.locator(".jp-gpulab-job-log")
        log.filter(has_text="epoch 1 loss 1.000").wait_for(timeout=SLOW)
        assert "epoch 4" not in log.inner_text()  # followed while it runs
        shot(page, "lab-jobs-following")
        log.filter(has_text="trained on").wait_for(timeout=SLOW)
        panel.locator(".jp-gpulab-job-log-state", has_text="has ended").wait_for(timeout=SLOW)
        text = log.inner_text()
        assert f"cwd {home / 'work'}" in text, text
        assert [x for x in text.splitlines() if x.startswith("epoch")] == [
            "epoch 1 loss 1.000",
            "epoch 2 loss 0.500",
            "epoch 3 loss 0.333",
            "epoch 4 loss 0.250",
        ]
        done = shown_as(panel, hub, name, job["id"], "succeeded")
        assert "succeeded (exit 0)" in done.inner_text()
        shot(page, "lab-jobs-succeeded")

        # A notebook, from the file browser's context menu, without a GPU.
        page.goto(hub.user_url(name, "lab/tree/work/nb"), timeout=SLOW)
        page.locator(".lm-TabBar-tab[data-id='filebrowser']").click()
        item = page.locator(".jp-DirListing-item[data-file-type='notebook']", has_text="analyse")
        item.click(button="right", timeout=SLOW)
        page.locator(".lm-Menu-item", has_text="Run as Job").click()
        page.locator(".jp-Dialog .jp-gpulab-job-command").wait_for(timeout=SLOW)
        command = page.locator(".jp-Dialog .jp-gpulab-job-command").input_value()
        assert command == "jupyter execute analyse.ipynb"
        dialog_submit(page, "none")
        nb_job = max(jobs_of(hub, name), key=lambda j: j["id"])
        assert (nb_job["command"], nb_job["cwd"]) == (command, "work/nb")
        shown_as(panel, hub, name, nb_job["id"], "succeeded")
        ran = home / "work" / "nb" / "nb-ran.txt"
        assert ran.read_text() == str(home / "work" / "nb")

        # A long job, then the JupyterLab server stops: the job keeps running on its own.
        write_in_home(
            home, "work/long.py", "import time\nprint('long', flush=True)\ntime.sleep(300)\n"
        )
        page.goto(hub.user_url(name, "lab/tree/work/long.py"), timeout=SLOW)
        page.locator(".jp-FileEditor .cm-content", has_text="time.sleep").wait_for(timeout=SLOW)
        # The open file is the main area's current tab (the workspace also reopens train.py).
        page.locator(".lm-DockPanel-tabBar .lm-TabBar-tab", has_text="long.py").click()
        if not panel.is_visible():
            page.locator(".lm-TabBar-tab[data-id='gpulab-jobs']").click()
        panel.locator(".jp-gpulab-jobs-run").click()
        command = page.locator(".jp-Dialog .jp-gpulab-job-command")
        command.wait_for(timeout=SLOW)
        assert command.input_value() == "python long.py"
        dialog_submit(page, "rtx-4090")
        long_job = max(jobs_of(hub, name), key=lambda j: j["id"])
        running = shown_as(panel, hub, name, long_job["id"], "running")
        # The person closes JupyterLab and their server is stopped.
        page.goto(f"{hub.url}/hub/home", timeout=SLOW)
        hub.stop_server(name)
        after = next(j for j in jobs_of(hub, name) if j["id"] == long_job["id"])
        assert after["state"] == "running", after
        assert hub.free("rtx-4090") == 0

        # Back in JupyterLab: the job is still there; Cancel ends it and frees its card.
        hub.spawn_ready(name, {"gpu": "none"}, timeout=120)
        page.goto(hub.user_url(name, "lab"), timeout=SLOW)
        page.locator(".lm-TabBar-tab[data-id='gpulab-jobs']").click()
        running.locator(".jp-gpulab-job-cancel").click()
        shown_as(panel, hub, name, long_job["id"], "cancelled")
        wait_for(lambda: hub.free("rtx-4090") == 1, 60, what="the job's card to be free again")
        shot(page, "lab-jobs-cancelled")
        assert not errors, errors
    finally:
        context.close()
        if hub.server(name) is not None:
            hub.stop_server(name)
