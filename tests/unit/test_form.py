"""The spawn form as rendered from its templates: operator- and user-supplied text is escaped."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest
from traitlets.config import Config

from gpulab.catalog import DEFAULT_CATALOG
from gpulab.spawners.form import render_form
from gpulab.spawners.market.hub import SpotMarket
from gpulab.spawners.node.pool import GpuPool

DATASET_NAME = "<script>alert('dataset')</script>"
IMAGE_NAME = 'Base"><img src=x onerror=alert(1)>'
GPU_NAME = "RTX 4090 <b>fast</b>"
NO_GPU_TEXT = "debug </fieldset><script>alert(2)</script>"


@pytest.fixture
def evil_pool(tmp_path: Path):
    """The node's pool and market on a custom catalog whose texts carry markup."""
    text = DEFAULT_CATALOG.read_text()
    for old, new in [
        ('display_name = "scikit-learn toy datasets"', f'display_name = "{DATASET_NAME}"'),
        ('display_name = "Base"', f"display_name = '{IMAGE_NAME}'"),
        ('display_name = "RTX 4090"', f'display_name = "{GPU_NAME}"'),
        ('"write and debug code on the same disk"', f'"{NO_GPU_TEXT}"'),
    ]:
        assert old in text, old
        text = text.replace(old, new)
    catalog = tmp_path / "catalog.toml"
    catalog.write_text(text)
    SpotMarket.clear_instance()  # one left by another test on this worker ignores this config
    GpuPool.clear_instance()
    c = Config()
    c.GpuPool.data_dir = str(tmp_path / "data")
    c.GpuPool.catalog_path = str(catalog)
    c.GpuInventory.simulate_gpus = "RTX-4090:1"
    pool = GpuPool.instance(config=c)
    market = SpotMarket.instance(config=c)
    yield pool, market, c
    SpotMarket.clear_instance()
    GpuPool.clear_instance()


def test_catalog_texts_and_user_values_come_out_escaped(evil_pool) -> None:
    pool, market, config = evil_pool
    user = 'al"ice<x>'
    # A queued request shows the user's own values (its id and max price) in the panel too.
    market.queued_entry = lambda owner: (
        {
            "id": "q-<i>1</i>",
            "user": user,
            "server": "",
            "gpu_type": "rtx-4090",
            "gpus": 1,
            "pricing": "spot",
            "max_price": "<u>0.40</u>",
            "windows_only": False,
            "queued_at": 0,
            "current_price": "0.55",
            "position": 1,
            "queue_length": 1,
            "options": {"gpu": "rtx-4090", "pricing": "spot", "max_price": '1"><script>x()'},
        }
        if owner == f"{user}/"
        else None
    )
    spawner = SimpleNamespace(
        pool=pool,
        config=config,
        user=SimpleNamespace(name=user),
        name="",
        user_options={"datasets": ["sklearn-toy"]},
    )
    html = asyncio.run(render_form(spawner))

    for raw in (DATASET_NAME, IMAGE_NAME, GPU_NAME, NO_GPU_TEXT, user, "q-<i>1</i>", "<u>0.40</u>"):
        assert raw not in html, raw
    assert "&lt;script&gt;alert(&#39;dataset&#39;)&lt;/script&gt;" in html
    assert "Base&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in html
    assert "RTX 4090 &lt;b&gt;fast&lt;/b&gt;" in html
    assert "debug &lt;/fieldset&gt;&lt;script&gt;alert(2)&lt;/script&gt;" in html
    assert 'data-user="al&#34;ice&lt;x&gt;"' in html
    assert 'value="1&#34;&gt;&lt;script&gt;x()"' in html
    # The form's own script and style are there, once each: nothing else opened a tag.
    assert html.count("<script>") == 1 and html.count("<style>") == 1
    assert 'data-gpu-free="rtx-4090">1/1 free' in html


def test_a_student_sees_only_what_their_courses_allow(evil_pool) -> None:
    pool, _market, config = evil_pool
    group = SimpleNamespace(
        name="ml101",
        properties={
            "gpulab_course": {
                "display_name": "Machine learning <101>",
                "limits": {"gpu_types": ["rtx-4090"], "images": ["base"], "datasets": []},
            }
        },
    )
    spawner = SimpleNamespace(
        pool=pool,
        config=config,
        user=SimpleNamespace(name="stud", groups=[group]),
        name="",
        user_options={},
    )
    html = asyncio.run(render_form(spawner))
    # The course picker, its title escaped; only the course's GPU type (checked: no-GPU is not
    # the course's), image and no dataset.
    assert '<select name="course"' in html and "Machine learning &lt;101&gt;" in html
    assert 'value="rtx-4090" checked' in html
    assert 'value="none"' not in html
    images = [s for s in pool.catalog.images if s != "base"]
    assert images and not [s for s in images if f'<option value="{s}"' in html]
    assert 'name="datasets"' not in html
    # A user in no course sees the whole catalog and no picker.
    spawner.user = SimpleNamespace(name="other", groups=[])
    html = asyncio.run(render_form(spawner))
    assert 'name="course"' not in html and 'value="none"' in html
