"""The image files agree with the catalog, and the apps' start scripts do what the hub expects.

No Docker and no internet here: the Dockerfiles are read, not built, and the start scripts run
against stand-in installs (a fake launch.py / main.py that prints what it was started with). The
images themselves are checked on a GPU host by images/*/gpu-smoke-test.sh (images/README.md).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import require
from harness import REPO

from gpulab.catalog import load_catalog
from gpulab.hub_config.cli.images import PARENTS

IMAGES = REPO / "images"
START_SCRIPTS = sorted(IMAGES.glob("*/start-*"))
SMOKE_TESTS = sorted(IMAGES.glob("*/gpu-smoke-test.sh"))
SMOKE_LIB = IMAGES / "gpu-smoke-lib.sh"  # what the smoke tests share (sourced)
CATALOG = load_catalog()


def instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined and comment lines dropped."""
    out: list[tuple[str, str]] = []
    current = ""
    for line in dockerfile.read_text().splitlines():
        if line.strip().startswith("#"):
            continue
        continued = line.rstrip().endswith("\\")
        current += line.rstrip().rstrip("\\").strip() + " " if continued else line
        if not continued:
            if current.strip():
                word, _, rest = current.strip().partition(" ")
                out.append((word.upper(), rest.strip()))
            current = ""
    return out


def parent_image(slug: str) -> str:
    """The image ``images/SLUG/Dockerfile`` builds FROM, with ``${BASE_IMAGE}`` resolved to the
    ARG's default."""
    args: dict[str, str] = {}
    for word, rest in instructions(IMAGES / slug / "Dockerfile"):
        if word == "ARG" and "=" in rest:
            name, _, default = rest.partition("=")
            args[name.strip()] = default.strip().strip('"')
        if word == "FROM":
            ref = rest.split()[0]
            return re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), ref)
    raise AssertionError(f"images/{slug}/Dockerfile has no FROM")


def catalog_slug_of(docker_image: str) -> str | None:
    return next((s for s, i in CATALOG.images.items() if i.docker_image == docker_image), None)


def chain(slug: str) -> list[str]:
    """The catalog image and its catalog ancestors, child first."""
    out = [slug]
    while (parent := catalog_slug_of(parent_image(out[-1]))) is not None:
        assert parent not in out, f"FROM cycle: {[*out, parent]}"
        out.append(parent)
    return out


# ---- Dockerfiles and the catalog ---------------------------------------------------------------


@pytest.mark.parametrize("slug", [s for s, i in CATALOG.images.items() if i.docker_image])
def test_catalog_image_has_a_dockerfile_whose_parents_are_catalog_images(slug: str) -> None:
    assert (IMAGES / slug / "Dockerfile").is_file(), f"no images/{slug}/Dockerfile"
    parent = parent_image(slug)
    if parent.startswith("gpulab/"):
        parent_slug = catalog_slug_of(parent)
        assert parent_slug, f"images/{slug} builds FROM {parent}, which no catalog image is"
        # `gpulab images --build` orders builds and passes BASE_IMAGE from PARENTS.
        assert PARENTS.get(slug) == parent_slug, (
            f"images_cli.PARENTS[{slug!r}] is {PARENTS.get(slug)!r}; its Dockerfile says {parent_slug!r}"
        )
        assert "BASE_IMAGE" in (IMAGES / slug / "Dockerfile").read_text()
    else:
        assert slug not in PARENTS, f"{slug} has no gpulab parent, yet PARENTS names one"
    chain(slug)  # resolves to an outside base without a cycle


def test_parents_name_catalog_images() -> None:
    for child, parent in PARENTS.items():
        assert child in CATALOG.images and parent in CATALOG.images, (child, parent)


@pytest.mark.parametrize("slug", [s for s, i in CATALOG.images.items() if i.docker_image])
def test_image_carries_the_preload_labels_itself_or_from_a_parent(slug: str) -> None:
    labels = " ".join(
        rest
        for s in chain(slug)
        for word, rest in instructions(IMAGES / s / "Dockerfile")
        if word == "LABEL"
    )
    for label in (
        "org.gpulab.preloads.libraries",
        "org.gpulab.preloads.models",
        "org.gpulab.preloads.datasets",
        "org.gpulab.cuda",
    ):
        assert f"{label}=" in labels, f"{slug}: no {label} label in {chain(slug)}"


@pytest.mark.parametrize(
    "dockerfile", sorted(IMAGES.glob("*/Dockerfile")), ids=lambda p: p.parent.name
)
def test_every_file_a_dockerfile_copies_is_in_the_checkout(dockerfile: Path) -> None:
    # The build context is the checkout (images_cli.build_image).
    for word, rest in instructions(dockerfile):
        if word != "COPY" or "--from" in rest:
            continue
        *sources, _dest = rest.split()
        for src in sources:
            assert list(REPO.glob(src.rstrip("/"))), (
                f"{dockerfile.parent.name}: COPY {src}: missing"
            )


# ---- Apps: their commands are in their images ----------------------------------------------------


APPS = {s: a for s, a in CATALOG.apps.items() if a.command}


def copies_to_path(slug: str, name: str) -> Path | None:
    """The checkout file that images/SLUG/Dockerfile copies to /usr/local/bin/NAME."""
    for word, rest in instructions(IMAGES / slug / "Dockerfile"):
        if word != "COPY":
            continue
        *sources, dest = rest.split()
        for src in sources:
            if Path(src).name == name and dest.rstrip("/") in (
                "/usr/local/bin",
                f"/usr/local/bin/{name}",
            ):
                return REPO / src
    return None


def pip_installs(slug: str) -> set[str]:
    names: set[str] = set()
    for word, rest in instructions(IMAGES / slug / "Dockerfile"):
        if word != "RUN":
            continue
        for part in re.split(r"&&|;|\|\|", rest):
            tokens = part.split()
            if tokens[:2] == ["pip", "install"]:
                names |= {
                    re.split(r"[<>=!~\[;]", t.strip("\"'"))[0].lower()
                    for t in tokens[2:]
                    if not t.startswith("-") and not t.startswith('"${') and not t.startswith("/")
                }
    return names


def deb_installs(slug: str) -> set[str]:
    """Debian packages images/SLUG/Dockerfile installs from a downloaded .deb (a release)."""
    names: set[str] = set()
    for word, rest in instructions(IMAGES / slug / "Dockerfile"):
        if word == "RUN":
            names |= set(re.findall(r"apt-get install[^&;|]*?/tmp/([a-z0-9-]+)\.deb", rest))
    return names


@pytest.mark.parametrize("app_slug", APPS)
def test_app_command_is_provided_by_its_image(app_slug: str) -> None:
    app = APPS[app_slug]
    assert app.image in CATALOG.images, f"apps.{app_slug}.image {app.image!r} is no catalog image"
    exe = app.command[0]
    if exe.startswith("start-"):
        # gpulab's own start scripts: copied into the image's /usr/local/bin (or a parent's).
        found = [copies_to_path(s, exe) for s in chain(app.image)]
        src = next((p for p in found if p is not None), None)
        assert src is not None, (
            f"no Dockerfile in {chain(app.image)} copies {exe} to /usr/local/bin"
        )
        assert src.is_file() and os.access(src, os.X_OK), f"{src} is missing or not executable"
    else:
        installed = set().union(*(pip_installs(s) | deb_installs(s) for s in chain(app.image)))
        assert exe in installed, (
            f"{exe}: not pip-installed in {chain(app.image)} ({sorted(installed)})"
        )


@pytest.mark.parametrize("app_slug", APPS)
def test_app_command_listens_on_loopback_only(app_slug: str) -> None:
    command = " ".join(APPS[app_slug].command + APPS[app_slug].local_command)
    assert "0.0.0.0" not in command
    for flag in ("--host", "--listen", "--server-name", "--ip", "--bind"):
        for m in re.finditer(rf"{flag}(?:=|\s+)(\S+)", command):
            assert m.group(1) == "127.0.0.1", f"{app_slug}: {flag} {m.group(1)}"


def test_start_scripts_take_the_catalog_contract() -> None:
    # `start-APP {port} {base_url}APP {models}`, and every start script in images/ is some app's.
    starts = {a.command[0]: a for a in APPS.values() if a.command[0].startswith("start-")}
    assert {p.name for p in START_SCRIPTS} == set(starts)
    for app in starts.values():
        assert app.command[1:] == ["{port}", "{base_url}" + app.slug, "{models}"], app.command


# ---- Start scripts -------------------------------------------------------------------------------


@pytest.mark.parametrize("script", START_SCRIPTS, ids=lambda p: p.name)
def test_start_script_is_executable_sh_and_loopback_only(script: Path) -> None:
    assert os.access(script, os.X_OK), f"{script} is not executable"
    assert script.read_text().startswith("#!/bin/sh\n")
    subprocess.run(["sh", "-n", str(script)], check=True)
    code = "\n".join(
        line for line in script.read_text().splitlines() if not line.lstrip().startswith("#")
    )
    assert "127.0.0.1" in code
    assert "0.0.0.0" not in code
    # --listen takes an address; a bare one means every address (ComfyUI: 0.0.0.0,::).
    assert not re.search(r"--listen(?!\s+127\.0\.0\.1)", code), "--listen without 127.0.0.1"


@pytest.mark.parametrize("script", SMOKE_TESTS, ids=lambda p: p.parent.name)
def test_smoke_test_script_parses(script: Path) -> None:
    assert os.access(script, os.X_OK), f"{script} is not executable"
    subprocess.run(["bash", "-n", str(script)], check=True)
    help_text = subprocess.run(
        ["bash", str(script), "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "Usage:" in help_text and "--model" in help_text


def test_smoke_test_lib_parses() -> None:
    subprocess.run(["bash", "-n", str(SMOKE_LIB)], check=True)


def test_every_app_image_has_a_smoke_test() -> None:
    assert {p.parent.name for p in SMOKE_TESTS} == {
        a.image for a in APPS.values() if a.command[0].startswith("start-")
    }


def test_shell_scripts_pass_shellcheck() -> None:
    require(shutil.which("shellcheck") is not None, "shellcheck")
    subprocess.run(["shellcheck", *map(str, [*START_SCRIPTS, *SMOKE_TESTS, SMOKE_LIB])], check=True)


def test_sd_webui_image_has_no_proxy_config_of_its_own() -> None:
    # The hub passes --ServerProxy.servers; an image's own would name an outdated command.
    assert not list(IMAGES.glob("*/jupyter_server_config.py"))
    for dockerfile in IMAGES.glob("*/Dockerfile"):
        assert "ServerProxy" not in dockerfile.read_text()


# ---- Start scripts against stand-in installs -----------------------------------------------------

FAKE_MAIN = "import json, os, sys\nprint(json.dumps({'cwd': os.getcwd(), 'argv': sys.argv[1:], 'prefix': os.environ.get('GPULAB_COMFYUI_PREFIX')}))\n"


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A model store as a Docker server sees it: ~/models/SLUG links to read-only mounts."""
    mounts = tmp_path / "mounts"
    tiny = mounts / "tiny-sd"
    (tiny / "unet").mkdir(parents=True)
    (tiny / "model_index.json").write_text("{}")
    (tiny / "unet" / "diffusion_pytorch_model.safetensors").write_bytes(b"x")
    (tiny / "single-file.safetensors").write_bytes(b"x")
    (mounts / "sd15").mkdir()
    (mounts / "sd15" / "v1-5.safetensors").write_bytes(b"x")
    models = tmp_path / "home" / "models"
    models.mkdir(parents=True)
    for m in mounts.iterdir():
        (models / m.name).symlink_to(m)
    return models


def run_start(script: str, tmp_path: Path, env: dict[str, str], *args: str) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "python").exists():
        (bin_dir / "python").symlink_to(sys.executable)
    r = subprocess.run(
        ["sh", str(next(p for p in START_SCRIPTS if p.name == script)), *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path / "home"), **env},
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def listed(folder: Path, exts=(".safetensors", ".ckpt")) -> set[str]:
    """What A1111/ComfyUI list below ``folder``: files with those endings, links followed."""
    return {
        str(Path(root, f).relative_to(folder))
        for root, _, files in os.walk(folder, followlinks=True)
        for f in files
        if f.endswith(exts)
    }


def test_start_sd_webui_hands_the_store_to_a1111(tmp_path: Path, store: Path) -> None:
    opt = tmp_path / "opt-sd-webui"
    (opt / "models" / "Stable-diffusion").mkdir(parents=True)
    (opt / "models" / "Stable-diffusion" / "preloaded.safetensors").write_bytes(b"x")
    (opt / "launch.py").write_text(FAKE_MAIN)
    hf = opt / "hf-preload" / "models--openai--clip-vit-large-patch14" / "snapshots"
    hf.mkdir(parents=True)
    env = {"SD_WEBUI_DIR": str(opt)}
    home = tmp_path / "home"

    out = run_start("start-sd-webui", tmp_path, env, "41234", "/user/a%40b/sd-webui/", str(store))
    argv = out["argv"]
    assert out["cwd"] == str(opt)
    ckpt = Path(argv[argv.index("--ckpt-dir") + 1])
    assert argv[argv.index("--server-name") + 1] == "127.0.0.1"
    assert argv[argv.index("--port") + 1] == "41234"
    assert argv[argv.index("--subpath") + 1] == "user/a%40b/sd-webui"
    assert argv[argv.index("--data-dir") + 1] == str(home / "sd-webui")
    assert "--api" in argv and "--listen" not in argv
    # A1111 skips every file below a dot folder.
    assert ckpt.is_relative_to(home / "sd-webui") and "/." not in str(ckpt)
    # The image's checkpoints, the checkpoint model, a diffusers folder's top-level file: not its
    # component weights.
    assert listed(ckpt) == {
        "image/preloaded.safetensors",
        "sd15/v1-5.safetensors",
        "tiny-sd/single-file.safetensors",
    }
    assert (home / "sd-webui" / "models" / "Stable-diffusion").is_dir()
    assert (home / ".cache/huggingface/hub/models--openai--clip-vit-large-patch14").is_dir()

    # Next start without the store: its links go, a file saved there (a merged model) stays.
    (ckpt / "merged.safetensors").write_bytes(b"x")
    run_start("start-sd-webui", tmp_path, env, "41234", "/user/a%40b/sd-webui")
    assert listed(ckpt) == {"image/preloaded.safetensors", "merged.safetensors"}
    assert (store / "sd15" / "v1-5.safetensors").exists()  # the store is untouched


def test_start_comfyui_maps_the_store_and_the_home(tmp_path: Path, store: Path) -> None:
    opt = tmp_path / "opt-comfyui"
    (opt / "comfy").mkdir(parents=True)
    (opt / "comfy" / "cli_args.py").write_text('parser.add_argument("--database-url")\n')
    (opt / "main.py").write_text(FAKE_MAIN)
    home = tmp_path / "home"
    (home / "comfyui").mkdir(parents=True)
    (home / "comfyui" / "extra_model_paths.yaml").write_text("mine: {}\n")

    out = run_start(
        "start-comfyui", tmp_path, {"COMFYUI_DIR": str(opt)}, "41235", "/user/a/comfyui", str(store)
    )
    argv = out["argv"]

    def arg(flag: str) -> str:
        return argv[argv.index(flag) + 1]

    assert out["cwd"] == str(opt) and out["prefix"] == "/user/a/comfyui"
    assert arg("--listen") == "127.0.0.1" and arg("--port") == "41235"
    assert arg("--output-directory") == str(home / "comfyui/output")
    assert arg("--input-directory") == str(home / "comfyui/input")
    assert arg("--user-directory") == str(home / "comfyui/user")
    assert Path(arg("--user-directory")).is_dir()  # ComfyUI refuses one that does not exist
    assert arg("--database-url") == f"sqlite:///{home}/comfyui/user/comfyui.db"
    i = argv.index("--extra-model-paths-config")
    conf_path, users_own = Path(argv[i + 1]), argv[i + 2]
    assert users_own == str(home / "comfyui/extra_model_paths.yaml")

    # Read the YAML the way ComfyUI's utils/extra_config.py does.
    paths: dict[str, list[str]] = {}
    for section in yaml.safe_load(conf_path.read_text()).values():
        base = section.pop("base_path", None)
        is_default = section.pop("is_default", False)  # first in the list, not last
        for kind, value in section.items():
            for line in filter(None, value.split("\n")):
                where = paths.setdefault(kind, [])
                where.insert(0 if is_default else len(where), os.path.join(base or "", line))
    assert paths["checkpoints"][0] == str(home / "comfyui/models/checkpoints")
    assert paths["loras"] == [str(home / "comfyui/models/loras")]
    assert paths["diffusers"][-1] == str(store)
    store_ckpts = Path(paths["checkpoints"][-1])
    assert listed(store_ckpts) == {"sd15/v1-5.safetensors", "tiny-sd/single-file.safetensors"}
    # What ComfyUI's Diffusers loader lists: folders holding model_index.json.
    found = [r for r, _, f in os.walk(store, followlinks=True) if "model_index.json" in f]
    assert [os.path.relpath(r, store) for r in found] == ["tiny-sd"]


def test_start_comfyui_leaves_out_what_an_older_comfyui_lacks(tmp_path: Path) -> None:
    opt = tmp_path / "opt-comfyui"
    (opt / "comfy").mkdir(parents=True)
    (opt / "comfy" / "cli_args.py").write_text("# no database here\n")
    (opt / "main.py").write_text(FAKE_MAIN)
    out = run_start("start-comfyui", tmp_path, {"COMFYUI_DIR": str(opt)}, "1", "/c")
    assert "--database-url" not in out["argv"]
    conf = yaml.safe_load(
        Path(out["argv"][out["argv"].index("--extra-model-paths-config") + 1]).read_text()
    )
    assert "diffusers" not in conf["gpulab_model_store"]  # no MODELS given


@pytest.mark.parametrize("script", START_SCRIPTS, ids=lambda p: p.name)
def test_start_script_needs_port_and_prefix(script: Path, tmp_path: Path) -> None:
    r = subprocess.run(
        ["sh", str(script), "8000"], capture_output=True, text=True, env={"HOME": str(tmp_path)}
    )
    assert r.returncode == 2 and "usage:" in r.stderr


# ---- Serving under the proxy prefix --------------------------------------------------------------


def load(path: Path):
    spec = importlib.util.spec_from_file_location(f"gpulab_test_{path.parent.name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sd_webui_extension_strips_the_prefix() -> None:
    mod = load(IMAGES / "sd-webui/gpulab-subpath/scripts/gpulab_subpath.py")
    seen: list[tuple[str, bytes]] = []

    async def app(scope, receive, send):
        if scope["type"] != "lifespan":
            seen.append((scope["path"], scope.get("raw_path")))

    mw = mod.StripPrefix(app, prefix="/user/a%40b/sd-webui")

    async def go() -> None:
        for path, raw in [
            ("/user/a@b/sd-webui/sdapi/v1/options", b"/user/a%40b/sd-webui/sdapi/v1/options"),
            ("/user/a@b/sd-webui", b"/user/a%40b/sd-webui"),
            ("/sdapi/v1/options", b"/sdapi/v1/options"),  # a proxy that strips it
            ("/user/a@b/sd-webuiX/x", b"/user/a%40b/sd-webuiX/x"),
        ]:
            await mw({"type": "http", "path": path, "raw_path": raw}, None, None)
        await mw({"type": "websocket", "path": "/user/a@b/sd-webui/queue/join"}, None, None)
        await mw({"type": "lifespan"}, None, None)

    asyncio.run(go())
    assert seen == [
        ("/sdapi/v1/options", b"/sdapi/v1/options"),
        ("/", b"/"),
        ("/sdapi/v1/options", b"/sdapi/v1/options"),
        ("/user/a@b/sd-webuiX/x", b"/user/a%40b/sd-webuiX/x"),
        ("/queue/join", None),
    ]


def test_comfyui_node_strips_the_prefix_before_routing() -> None:
    import aiohttp.web as web  # jupyter-server-proxy's own dependency
    from aiohttp.test_utils import TestClient, TestServer

    mod = load(IMAGES / "comfyui/custom_nodes/gpulab_subpath/__init__.py")
    assert mod.NODE_CLASS_MAPPINGS == {}  # ComfyUI loads a custom node only with this

    async def go() -> list:
        routes = web.RouteTableDef()

        @routes.get("/system_stats")
        async def stats(request):
            return web.json_response({"q": request.query.get("x")})

        @routes.post("/api/userdata/{file}")
        async def userdata(request):
            return web.json_response({"file": request.match_info["file"], "raw": request.raw_path})

        app = web.Application()
        app.add_routes(routes)
        mod.serve_under_prefix(app, "/user/a%40b/comfyui")
        out = []
        async with TestClient(TestServer(app)) as client:
            for path in (
                "/user/a%40b/comfyui/system_stats?x=1",
                "/user/a@b/comfyui/system_stats",
                "/system_stats",
                "/user/a%40b/comfyuiX/system_stats",
            ):
                r = await client.get(path)
                out.append(r.status)
            r = await client.post("/user/a%40b/comfyui/api/userdata/workflows%2Fw.json", data=b"{}")
            out.append(await r.json())
        return out

    assert asyncio.run(go()) == [
        200,
        200,
        200,
        404,
        {"file": "workflows/w.json", "raw": "/api/userdata/workflows%2Fw.json"},
    ]
