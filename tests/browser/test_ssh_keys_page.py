"""Issue 25, "authenticated by the user's public keys (managed on their home page, several per
user)" and "the README shows how to connect": the home page's SSH card in headless Chromium.

A person logs in, reads the `ssh -p PORT NAME@HOST` command the hub shows, pastes a private key
by mistake (refused by the page, never sent), a broken one (the hub's refusal shown), adds their public key with a title
(listed with the fingerprint `ssh-keygen -l` prints), adds a second one, and removes one. On the
old home page there was no SSH card, so every locator below timed out. Set
GPULAB_SCREENSHOTS=DIR to keep the pages as PNG files.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from browser_helpers import shot
from harness import PASSWORD, SLOW, Hub, approved_user, browser_log_in
from playwright.sync_api import expect


@pytest.fixture(scope="module")
def shub(module_hub_factory) -> Hub:
    return module_hub_factory("ssh-page", simulate="RTX-4090:1", ssh_port=True)


def keygen(folder: Path, name: str) -> tuple[Path, str]:
    """A new ed25519 key pair in ``folder``: (private key path, SHA256 fingerprint)."""
    path = folder / name
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{name}@laptop", "-f", str(path)],
        check=True,
    )
    out = subprocess.run(
        ["ssh-keygen", "-l", "-E", "sha256", "-f", f"{path}.pub"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return path, out.split()[1]


def test_a_user_adds_and_removes_a_key_on_the_home_page(shub: Hub, browser, tmp_path: Path) -> None:
    name = approved_user(shub, "sshpage")
    first, fp1 = keygen(tmp_path, "first")
    second, fp2 = keygen(tmp_path, "second")
    context = browser.new_context(viewport={"width": 1280, "height": 1000})
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"pageerror: {e}"))
    try:
        browser_log_in(page, shub, name, PASSWORD)
        page.goto(f"{shub.url}/hub/home")
        card = page.locator("#gpulab-ssh")
        expect(card.locator("#gpulab-ssh-command")).to_have_text(
            f"ssh -p {shub.ssh_port} {name}@localhost", timeout=SLOW
        )
        expect(card.locator("#gpulab-ssh-none")).to_have_text("No keys yet.")
        expect(card.locator("#gpulab-ssh-count")).to_have_text("0 of 10")
        card.scroll_into_view_if_needed()
        shot(page, "ssh-01-no-keys")

        # A private key pasted by mistake: refused by the page itself, never sent anywhere.
        posts: list[str] = []
        page.on(
            "request", lambda r: posts.append(r.post_data or "") if r.method == "POST" else None
        )
        page.fill("#gpulab-ssh-key", first.read_text())
        page.click("#gpulab-ssh-add")
        answer = page.locator("#gpulab-ssh-answer")
        expect(answer).to_contain_text("PRIVATE key: it was not sent", timeout=SLOW)
        expect(answer).to_have_class("small mt-1 mb-0 text-danger")
        expect(page.locator("#gpulab-ssh-key")).to_have_value("")
        assert not [p for p in posts if "PRIVATE" in p], posts
        shot(page, "ssh-02-private-key-refused")

        # A broken key: the hub's own refusal, naming the field and what is allowed.
        page.fill("#gpulab-ssh-key", "ssh-ed25519 not-a-key")
        page.click("#gpulab-ssh-add")
        expect(answer).to_contain_text("key: the key data is not valid base64", timeout=SLOW)
        expect(card.locator("#gpulab-ssh-none")).to_be_visible()
        shot(page, "ssh-02b-bad-key-refused")

        page.fill("#gpulab-ssh-key", Path(f"{first}.pub").read_text())
        page.fill("#gpulab-ssh-title", "work laptop")
        page.click("#gpulab-ssh-add")
        row = card.locator(f'tr[data-fingerprint="{fp1}"]')
        expect(row).to_contain_text("work laptop", timeout=SLOW)
        expect(row).to_contain_text(fp1)
        expect(row).to_contain_text("ssh-ed25519")
        expect(answer).to_have_text(f"Added {fp1}.")
        expect(page.locator("#gpulab-ssh-key")).to_have_value("")

        page.fill("#gpulab-ssh-key", Path(f"{second}.pub").read_text())
        page.click("#gpulab-ssh-add")
        row2 = card.locator(f'tr[data-fingerprint="{fp2}"]')
        expect(row2).to_contain_text("second@laptop", timeout=SLOW)  # the comment as title
        expect(card.locator("#gpulab-ssh-count")).to_have_text("2 of 10")
        shot(page, "ssh-03-two-keys")

        row.get_by_role("button", name="Remove key work laptop").click()
        expect(row).to_have_count(0, timeout=SLOW)
        expect(answer).to_have_text("Removed work laptop.")
        expect(row2).to_be_visible()
        shot(page, "ssh-04-one-removed")

        # What the page shows is what the hub keeps.
        token = shub.api("POST", f"/users/{name}/tokens", json={"expires_in": 600}).json()["token"]
        keys = shub.api("GET", f"/gpulab/users/{name}/ssh-keys", token=token).json()["keys"]
        assert [k["fingerprint"] for k in keys] == [fp2]
        # The only console errors are the refused POST's (a 400 is an answer, shown on the page).
        unexpected = [e for e in errors if "status of 400" not in e]
        assert not unexpected, unexpected
    finally:
        context.close()
