"""``gpulab``: the command line of a gpulab node.

``gpulab up`` validates the catalog and GPU settings, prepares the data dir (admin password on
first start, the demo model for the Stable Diffusion tile), runs JupyterHub in this process
(:mod:`.hub_app`) and, once it runs, prints how to log in: last, where a person looks.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from urllib.parse import urlparse

from gpulab.catalog import CatalogError, load_catalog, settings
from gpulab.hub_config import origin
from gpulab.hub_config.cli.images import add_images_parser, cmd_images
from gpulab.hub_config.cli.jobs import add_jobs_parser, cmd_jobs
from gpulab.hub_config.cli.kubernetes import add_kubernetes_parser, cmd_kubernetes
from gpulab.hub_config.cli.models import TINY, add_models_parser, cmd_models, make_tiny_sd
from gpulab.hub_config.data_dir import admin_password, make_private_data_dir
from gpulab.spawners.node.inventory import GpuInventory, SimulateSpecError, parse_simulate_spec

CONFIG_FILE = Path(__file__).resolve().parent.parent / "jupyterhub_config.py"
DEMO_POOL = settings.DEMO_POOL


# How --help names a flag's value, where its name alone does not say.
METAVARS = {"--simulate-gpus": "SPEC", "--subdomain-host": "URL"}


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of the settings table (gpulab.catalog.settings), with its help and defaults.

    Each flag defaults to None: :func:`resolve_settings` fills in the environment's value or the
    table's default afterwards, so that ``gpulab config`` can say where each value came from."""
    for s in settings.TABLE:
        if not s.flag:
            continue
        shown = s.shown_default()
        if s.kind == "str" and shown == "(unset)":
            shown = "empty"
        kw: dict = {
            "default": None,
            "help": f"{s.help} (default {shown}) [env {s.name}]",
        }
        if s.kind == "bool":
            kw["action"] = "store_true"
        else:
            kw["type"] = _flag_type(s)
            if s.choices:
                kw["choices"] = s.choices
            if s.flag in METAVARS:
                kw["metavar"] = METAVARS[s.flag]
        parser.add_argument(s.flag, dest=_dest(s), **kw)


def _dest(s: settings.Setting) -> str:
    return s.flag.removeprefix("--").replace("-", "_")


def _flag_type(s: settings.Setting):
    def parse(value: str):
        try:
            return s.parse(value, label="value")
        except settings.SettingError as e:
            raise argparse.ArgumentTypeError(str(e).removeprefix("value: ")) from None

    parse.__name__ = s.kind  # argparse names the type in some messages
    return parse


def resolve_settings(args: argparse.Namespace, env=None) -> list[settings.Effective]:
    """Fill every flag left out with the environment's value, else the table's default; the
    settings with their sources. :class:`SettingError` names a bad variable."""
    given = {
        s.name: getattr(args, _dest(s))
        for s in settings.TABLE
        if s.flag and getattr(args, _dest(s), None) is not None
    }
    rows = settings.effective(env, given)
    for row in rows:
        if row.setting.flag:
            setattr(args, _dest(row.setting), row.value)
    return rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpulab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the platform (JupyterHub + GPU spawner + SQLite)")
    add_setting_flags(up)
    up.add_argument("jupyterhub_args", nargs="*", help="extra JupyterHub arguments (after --)")
    add_images_parser(sub)
    add_models_parser(sub)
    add_kubernetes_parser(sub)
    add_jobs_parser(sub)
    add_config_parser(sub)
    return parser


def resolve_simulation(spec: str, catalog_path: str) -> str:
    """Turn 'auto'/'none'/a spec into the spec the hub uses, validating it against the catalog."""
    catalog = load_catalog(catalog_path or None)
    if spec == "none":
        return ""
    if spec == "auto":
        inventory = GpuInventory(catalog)
        if inventory.devices:
            return ""
        print(f"gpulab: no GPU found by NVML; simulating a demo pool: {DEMO_POOL} (SIMULATED)")
        spec = DEMO_POOL
    parse_simulate_spec(spec, catalog)
    return spec


def cmd_up(args: argparse.Namespace) -> int:
    try:
        resolve_settings(args)
    except settings.SettingError as e:
        print(f"gpulab: {e}", file=sys.stderr)
        return 2
    data_dir = Path(args.data_dir).resolve()
    if args.spawner == "swarm":
        if args.simulate_gpus not in ("auto", "none"):
            print(
                "gpulab: --simulate-gpus: a swarm's cards are its nodes' (simulated ones are "
                "advertised by the nodes, labelled gpulab.simulated=true); allowed: auto, none",
                file=sys.stderr,
            )
            return 2
        args.simulate_gpus = "none"
    try:
        simulate = resolve_simulation(args.simulate_gpus, args.catalog)
    except (CatalogError, SimulateSpecError) as e:
        print(f"gpulab: {e}", file=sys.stderr)
        return 2
    make_private_data_dir(data_dir)
    password, new = admin_password(data_dir)
    os.environ.update(
        GPULAB_DATA_DIR=str(data_dir),
        GPULAB_IP=args.ip,
        GPULAB_PORT=str(args.port),
        GPULAB_HUB_PORT=str(args.hub_port),
        GPULAB_PROXY_API_PORT=str(args.proxy_api_port),
        GPULAB_SIMULATE_GPUS=simulate,
        GPULAB_CATALOG=args.catalog,
        GPULAB_OPEN_SIGNUP="1" if args.open_signup else "0",
        GPULAB_UNSAFE_SIGNUP_WITHOUT_ISOLATION="1" if args.unsafe_signup_without_isolation else "0",
        GPULAB_SPAWNER=args.spawner,
        GPULAB_SUBDOMAIN_HOST=args.subdomain_host,
        GPULAB_SSH_PORT=str(args.ssh_port),
    )
    try:
        users_host = origin.users_host(args.subdomain_host, args.port)
    except ValueError as e:
        print(f"gpulab: {e}", file=sys.stderr)
        return 2
    if users_host:
        hub_url = users_host
        print(f"gpulab: starting on {hub_url}  (data: {data_dir})")
        name = urlparse(users_host)
        print(
            f"gpulab: each user's server on its own origin: {name.scheme}://NAME.{name.netloc}"
            f"/user/NAME/ (open the hub at {users_host}, not at its IP address)"
        )
    else:
        host = "127.0.0.1" if args.ip in ("", "0.0.0.0") else args.ip
        hub_url = f"http://{host}:{args.port}"
        print(f"gpulab: starting on {hub_url}  (data: {data_dir})")
        print(
            "gpulab: WARNING: --subdomain-host none: users' servers share the hub's origin, so "
            "a page a user serves can act as anyone who opens it (staff included)"
        )
    if settings.get("GPULAB_DEMO_MODEL"):
        ensure_demo_model(data_dir, args.catalog)
    signup = args.spawner != "local" or os.geteuid() == 0 or args.unsafe_signup_without_isolation
    banner = login_banner(
        hub_url, data_dir, password if new else None, signup=signup, open_signup=args.open_signup
    )
    sys.stdout.flush()

    # JupyterHub's app is heavy to import: only `gpulab up` needs it.
    from gpulab.hub_config.cli.hub_app import GpulabHub

    # The instance launch_instance runs (a singleton), made first to hand it the banner.
    GpulabHub.instance(login_banner=banner)
    GpulabHub.launch_instance(["-f", str(CONFIG_FILE), *args.jupyterhub_args])
    return 0


def login_banner(
    hub_url: str, data_dir: Path, password: str | None, *, signup: bool, open_signup: bool
) -> list[str]:
    """What ``gpulab up`` prints once the hub runs: where to open it and how to log in."""
    admin = settings.get("GPULAB_ADMIN_USER")
    if password is not None:
        login = (
            f"log in as '{admin}' with password {password}  (saved in {data_dir}/admin-password)"
        )
    else:
        login = f"log in as '{admin}'; the password is in {data_dir}/admin-password"
    lines = [f"gpulab is running: open {hub_url}/"]
    if signup:
        lines.append(
            f"  new users sign up at {hub_url}/hub/signup; "
            + (
                "sign-up is open."
                if open_signup
                else f"you approve them at {hub_url}/hub/authorize"
            )
        )
    lines.append("  Ctrl-C stops gpulab and every server it runs.")
    # The log-in line last of all: the one a person looks for.
    lines.append(f"  {login}")
    return lines


def ensure_demo_model(data_dir: Path, catalog_path: str) -> None:
    """Make the catalog's demo model (``tiny-sd``: a 7 MB Stable Diffusion pipeline with random
    weights) in this data dir's model store if it is missing, so that the Stable Diffusion tile
    has a model to load. Its maker's output goes to a log file in the data dir; a failure is a
    warning (the tile then says it has no model), never a reason not to start."""
    try:
        model = load_catalog(catalog_path or None).models.get(TINY)
    except CatalogError:
        return  # cmd_up has checked the catalog already
    if model is None:
        return  # an operator's catalog without the demo model
    target = model.resolve_source(data_dir)
    if (target / "model_index.json").exists():
        return
    log = data_dir / "demo-model.log"
    print(
        f"gpulab: making the demo model for the Stable Diffusion tile ({TINY}, random weights, "
        f"{model.size}; once) in {target}",
        flush=True,
    )
    status = _quietly(lambda: make_tiny_sd(target), log)
    if status:
        print(
            f"gpulab: WARNING: the demo model could not be made (see {log}); the Stable "
            "Diffusion tile has no model until `gpulab models --make-tiny-sd` makes it",
            file=sys.stderr,
        )


def _quietly(run, log: Path) -> int:
    """``run()`` with this process's stdout and stderr (its children's too) going to ``log``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        with open(log, "wb") as out:
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
            try:
                return run()
            except Exception as e:  # a warning for the operator, not a failed start
                print(f"gpulab: {e!r}", file=sys.stderr)
                return 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def add_config_parser(sub) -> None:
    p = sub.add_parser(
        "config",
        help="print the effective GPULAB_* settings and where each came from",
        description="The effective GPULAB_* settings (the flags of `gpulab up` are accepted "
        "too, to see what they would change) and where each came from: the table's default, "
        "the environment, or a flag. Bad values are listed and the exit status is 2.",
    )
    p.add_argument(
        "--all", action="store_true", help="add the internal hand-overs and the test knobs"
    )
    p.add_argument(
        "--markdown",
        action="store_true",
        help="print the README's settings table (generated from the declaration) instead",
    )
    add_setting_flags(p)


def cmd_config(args: argparse.Namespace, env=None, out=None) -> int:
    out = out or sys.stdout
    if args.markdown:
        out.write(settings.markdown())
        return 0
    env = os.environ if env is None else env
    bad = settings.problems(env)
    bad_names = {m.split(":", 1)[0] for m in bad}
    # Report every bad variable at once, and show the rest as they are.
    clean = {k: v for k, v in env.items() if k not in bad_names}
    rows = resolve_settings(args, clean)
    if args.all:
        given = {r.setting.name: r.value for r in rows if r.source.startswith("flag")}
        rows = settings.effective(clean, given, settings.SCOPES)
    table = [
        (r.setting.name, f"{env[r.setting.name]!r} NOT ALLOWED", "environment")
        if r.setting.name in bad_names
        else (r.setting.name, r.shown(), r.source)
        for r in rows
    ]
    width = max(len(name) for name, _, _ in table) + 2
    vwidth = min(40, max(len(value) for _, value, _ in table)) + 2
    print("gpulab config: the effective GPULAB_* settings and where each came from", file=out)
    group = None
    for r, (name, value, source) in zip(rows, table, strict=True):
        if r.setting.group != group:
            group = r.setting.group
            print(f"\n{group}", file=out)
        print(f"  {name:<{width}}{value:<{vwidth}}{source}", file=out)
    unknown = settings.undeclared(env)
    if unknown:
        print("\nnot gpulab settings (a typo?): " + ", ".join(unknown), file=out)
    if bad:
        print("", file=sys.stderr)
        for message in bad:
            print(f"gpulab: {message}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "up":
        return cmd_up(args)
    if args.command == "images":
        return cmd_images(args)
    if args.command == "models":
        return cmd_models(args)
    if args.command == "kubernetes":
        return cmd_kubernetes(args)
    if args.command == "config":
        return cmd_config(args)
    if args.command == "jobs":
        return cmd_jobs(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
