"""Issue 26 (the job-server guard on the spawn page): a person who opens, or posts, the spawn
form of a server named ``job-ID`` in headless Chromium is told in plain words that such servers
are the platform's training jobs, and nothing starts; their own spawn form is unchanged. Set
GPULAB_SCREENSHOTS=DIR to keep the pages as PNG files.
"""

from __future__ import annotations

from browser_helpers import shot
from harness import PASSWORD, Hub, approved_user, browser_log_in


def test_the_spawn_page_of_a_job_server_says_why_and_starts_nothing(hub: Hub, browser) -> None:
    name = approved_user(hub, "jobpage")
    context = browser.new_context(viewport={"width": 1200, "height": 700})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    try:
        browser_log_in(page, hub, name, PASSWORD)
        answer = page.goto(f"{hub.url}/hub/spawn/{name}/job-1")
        assert answer is not None and answer.status == 403
        text = page.inner_text("body")
        assert "the name of a training job's server, which only the platform starts" in text
        assert "Jobs card" in text and "server_name:" not in text, text
        shot(page, "job-server-spawn-page-403")
        answer = page.goto(f"{hub.url}/hub/spawn")
        assert answer is not None and answer.status == 200
        assert page.locator("form#spawn_form, form").count() >= 1
        shot(page, "spawn-form-unchanged")
        assert all(s.startswith("job-") is False for s in hub.user(name)["servers"])
        # The 403 page's own resource load is the only console error a browser reports for it.
        assert [e for e in errors if "403" not in e] == [], errors
    finally:
        context.close()
