"""Users' own datasets in Docker servers (issue 23, "your own datasets"): a folder alice's
container wrote into her home, published as ``@alice/NAME``, is bind-mounted read-only at
``/datasets/@alice.NAME`` (linked from ``~/datasets``) in bob's container once she shares it with
him, and nobody in the container can write into it, its root included.

Fails on the old code: ``@alice/...`` was an unknown dataset (400) and the Docker spawner looked
every dataset up in the catalog.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from course_helpers import token_for
from docker_helpers import start_docker_hub
from harness import Hub, KernelError, wait_for


@pytest.fixture(scope="module")
def dshub(module_hub_factory, docker, catalog: Path) -> Hub:
    return start_docker_hub(module_hub_factory, docker, "dshub", catalog)


def test_a_shared_dataset_is_a_read_only_mount_in_another_users_container(dshub, docker) -> None:
    hub = dshub
    alice, bob = hub.create_user(), hub.create_user()
    a_token = token_for(hub, alice)
    hub.spawn_ready(alice, {"gpu": "none"})
    try:
        with hub.kernel(alice) as k:
            k.execute(
                "import os; os.makedirs(os.path.expanduser('~/faces'), exist_ok=True);"
                "open(os.path.expanduser('~/faces/a.txt'), 'w').write('alice v1')"
            )
    finally:
        hub.stop_server(alice)
    r = hub.api(
        "POST", f"/users/{alice}/datasets", token=a_token, json={"folder": "faces", "name": "faces"}
    )
    assert r.status_code in (201, 202), r.text

    def ready() -> bool:
        got = hub.api("GET", f"/users/{alice}/datasets/faces", token=a_token).json()["dataset"]
        assert got["state"] != "failed", got
        return got["state"] == "ready"

    wait_for(ready, 120, what="the publish")
    slug = f"@{alice}/faces"
    r = hub.spawn(bob, {"gpu": "none", "datasets": [slug]})
    assert r.status_code == 400 and r.json()["field"] == "datasets", r.text
    r = hub.api(
        "PUT", f"/users/{alice}/datasets/faces/sharing", token=a_token, json={"users": [bob]}
    )
    assert r.status_code == 200, r.text

    hub.spawn_ready(bob, {"gpu": "none", "datasets": [slug, "sklearn-toy"]})
    try:
        with hub.kernel(bob) as k:
            k.execute("import os")
            got = k.execute(
                f"print(open(os.path.expanduser('~/datasets/@{alice}.faces/a.txt')).read())"
            )
            assert got.strip() == "alice v1"
            for target in (f"/datasets/@{alice}.faces/a.txt", f"/datasets/@{alice}.faces/new"):
                with pytest.raises(KernelError, match=r"(Read-only file system|Permission denied)"):
                    k.execute(f"open({target!r}, 'a')")
            mounts = [
                m.split() for m in k.execute("print(open('/proc/mounts').read())").splitlines()
            ]
            [fields] = [m for m in mounts if len(m) > 3 and m[1] == f"/datasets/@{alice}.faces"]
            assert "ro" in fields[3].split(",")
    finally:
        hub.stop_server(bob)
