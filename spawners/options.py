"""The spawn contract shared by the HTML form and REST spawns, as one typed model.

``POST /hub/api/users/NAME/server`` with a JSON body, or the spawn form, both end up here::

    {"app": "jupyterlab", "image": "base", "gpu": "a100-80g" | "none", "gpus": 1,
     "datasets": ["sklearn-toy", "@alice/faces"], "pricing": "on-demand" | "spot",
     "max_price": 1.5, "confirm_max_price": false, "wait": false, "windows_only": false, "course": "ml101" | null}

``datasets`` lists catalog datasets and users' own (``@OWNER/NAME``,
:mod:`gpulab.spawners.storage.datasets`): here a user's dataset is only checked to be spelled
that way; whether the server's user may read it is checked at every start by the spawner.

``course`` names the course whose rules and credit a server runs under (see
:mod:`gpulab.spawners.courses`); here it is only checked to be a slug, since membership is the
hub's to check.

``app`` (default JupyterLab) picks what the server opens on; an app that names an image runs in
it (``image`` then defaults to it) and only on the GPU types it fits.

Every field is checked against the catalog; an error names the field and the allowed values.
Nothing is "fixed" quietly: a value that cannot be read is refused, never replaced by a default.

``max_price`` (per card-hour, spot only) must read as a positive decimal number with at most
:data:`PRICE_PLACES` decimal places, below 10 ** (:data:`MAX_PRICE_DIGITS` + 1), and at most :data:`MAX_PRICE_CEILING` times the type's
on-demand price; a bid above :data:`CONFIRM_FACTOR` times the on-demand price is refused until
the request also says ``"confirm_max_price": true`` (a slip of the finger, 1e9 for 0.9, must not
become a bid that never lets the server be reclaimed).

Every refusal (:class:`OptionsError`) carries two texts: ``str(e)`` names the API's field and
the allowed values, for API clients; ``e.human`` says the same in plain words for the person in
front of a form, and ``e.details()`` adds the field (and ``confirm``, the field that accepts a
bid that needs confirming) for pages that offer a confirm step.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from typing import Any

from pydantic import BaseModel, ConfigDict

from gpulab.catalog import DEFAULT_APP, NO_GPU, App, Catalog
from gpulab.catalog.pricing import Quote, quote
from gpulab.spawners.storage.datasets import is_private, parse_slug

PRICING = ("on-demand", "spot")
FIELDS = (
    "app",
    "image",
    "gpu",
    "gpus",
    "datasets",
    "pricing",
    "max_price",
    "confirm_max_price",
    "wait",
    "windows_only",
    "course",
)
COURSE_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")

DEFAULTS: dict[str, Any] = {
    "app": DEFAULT_APP,
    "image": "base",
    "gpu": NO_GPU,
    "gpus": 1,
    "datasets": [],
    "pricing": "on-demand",
    "max_price": None,
    "confirm_max_price": False,
    "wait": False,
    "windows_only": False,
    "course": None,
}


# A max price above this many times the type's on-demand price needs "confirm_max_price".
CONFIRM_FACTOR = Decimal(10)
# A max price above this many times the on-demand price is refused outright (a typo, 1e20).
MAX_PRICE_CEILING = Decimal(1000)
# Prices have at most this many decimal places (billing keeps bids to the millionth).
PRICE_PLACES = 6
# A max price has at most this many digits before the decimal point, plus one (1e20: a typo).
MAX_PRICE_DIGITS = 8

# What a person calls each field (the spawn form's and the home page's words).
LABELS = {
    "app": "App",
    "image": "Image",
    "gpu": "GPU type",
    "gpus": "Number of GPUs",
    "datasets": "Datasets",
    "pricing": "Pricing",
    "max_price": "Max price",
    "confirm_max_price": "Max price confirmation",
    "wait": "Queue option",
    "windows_only": "Low-price windows option",
    "course": "Course",
    "user_options": "Server options",
}


class OptionsError(ValueError):
    """Bad spawn options. ``field`` is the offending key; ``str()`` names it and the allowed
    values (the API's words); ``human`` says it in plain words for a person; ``confirm`` names
    the field that accepts the value anyway (a max price that needs confirming), else None."""

    def __init__(
        self, field: str, message: str, human: str | None = None, *, confirm: str | None = None
    ) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.human = human or f"{LABELS.get(field, field)}: {message}"
        self.confirm = confirm

    def details(self) -> dict[str, Any]:
        """The refusal's machine-readable part, for JSON answers: field (and confirm)."""
        out: dict[str, Any] = {"field": self.field}
        if self.confirm:
            out["confirm"] = self.confirm
        return out


class ServerOptions(BaseModel):
    """Validated spawn options. Build with :func:`parse_options`, never directly from input."""

    model_config = ConfigDict(frozen=True)

    image: str
    gpu: str  # a GPU type slug, or NO_GPU
    gpus: int  # 0 in no-GPU mode
    datasets: tuple[str, ...]
    pricing: str
    max_price: Decimal | None  # per card-hour; spot only
    # Spot only: the user confirmed a max price above CONFIRM_FACTOR times on-demand.
    confirm_max_price: bool = False
    # Spot only: queue the request when it can't start now, instead of answering 409.
    wait: bool = False
    # Spot only: run only inside the market's low-price windows (queued outside them).
    windows_only: bool = False
    # What the server opens on: a catalog app slug (JupyterLab by default).
    app: str = DEFAULT_APP
    # The course this server runs under (its limits, its credit pool, its education prices).
    course: str | None = None

    def quote(self, catalog: Catalog, spot_price: Decimal | None = None) -> Quote:
        """This server's price now, from the one price function billing rates by: the education
        price for a course server on demand, and on spot the ``spot_price`` in force (the
        market's; None: none known, the on-demand price) never above its bid."""
        return quote(
            catalog,
            self.gpu,
            self.gpus,
            self.pricing,
            spot_price=spot_price,
            bid=self.max_price if self.pricing == "spot" else None,
            education=self.course is not None,
        )

    def price_per_hour(self, catalog: Catalog, spot_price: Decimal | None = None) -> Decimal:
        """What this server costs per hour (see :meth:`quote`): what its status bar shows."""
        return self.quote(catalog, spot_price).per_hour

    def label(self, catalog: Catalog) -> str:
        if self.gpu == NO_GPU:
            return catalog.no_gpu.display_name
        return f"{catalog.gpu_types[self.gpu].display_name} x{self.gpus}"

    def to_json(self) -> dict[str, Any]:
        out = self.model_dump(mode="json")
        out["datasets"] = list(self.datasets)
        out["max_price"] = None if self.max_price is None else str(self.max_price)
        return out


def app_gpu_types(app: App, catalog: Catalog) -> list[str]:
    """The GPU types (and NO_GPU) a server running ``app`` may have, in catalog order."""
    out = [
        slug
        for slug, gt in catalog.gpu_types.items()
        if app.runs_on(slug, gt.vram_gb)
        and (app.image is None or catalog.images[app.image].supports(slug))
    ]
    return [*out, NO_GPU] if app.runs_on(NO_GPU, 0) else out


def _allowed(values: Any) -> str:
    return ", ".join(str(v) for v in values)


def _money(catalog: Catalog, amount: Decimal) -> str:
    """``CNY 0.68``: a price as the pages show it."""
    return f"{catalog.currency} {amount:,.2f}" if amount >= Decimal("0.01") else f"{amount}"


def _as_int(field: str, value: Any) -> int:
    human = f"{LABELS.get(field, field)} must be a whole number, not “{value}”."
    if isinstance(value, bool):
        raise OptionsError(field, f"must be a whole number, not {value!r}", human)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    raise OptionsError(field, f"must be a whole number, not {value!r}", human)


# A price as people write it: ASCII digits, an optional fraction and exponent.
_PLAIN_NUMBER = re.compile(r"[0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?")


def parse_max_price(value: Any, field: str = "max_price") -> Decimal:
    """A max price as the user wrote it (a JSON number or a string) -> Decimal, or OptionsError
    naming ``field``: not a number, NaN or infinite, zero or negative, or more decimal places
    than prices have. How high is sensible depends on the GPU type (see :func:`check_max_price`).
    The one reader of a max price: the options and the launch plan both use it."""
    plain = (
        f"The max price must be a positive number of money per card-hour, like 0.50; "
        f"“{value}” is not one."
    )
    api = f"must be a positive number (price per card-hour, e.g. 0.50), not {value!r}"
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise OptionsError(field, api, plain)
    if isinstance(value, float) and not math.isfinite(value):
        raise OptionsError(field, api, plain)
    text = str(value).strip()
    if isinstance(value, str) and not _PLAIN_NUMBER.fullmatch(text):
        # Decimal() also reads non-ASCII digits, "1_0" and "+1": one ASCII grammar is simpler to reason
        # about (attack wave F8), and what people type in a price box fits it.
        raise OptionsError(field, api, plain)
    try:
        price = Decimal(text)
    except InvalidOperation:
        raise OptionsError(field, api, plain) from None
    if not price.is_finite() or price <= 0:
        raise OptionsError(field, api, plain)
    if price.adjusted() > MAX_PRICE_DIGITS:
        # 1e999999 reads as a finite Decimal: no price has that many digits (nor any message).
        raise OptionsError(
            field,
            f"at most {MAX_PRICE_DIGITS + 1} digits before the decimal point, not {value!r}",
            f"The max price must be a sensible amount of money per card-hour, like 0.50; "
            f"“{value}” is not one.",
        )
    exponent = price.normalize().as_tuple().exponent
    if isinstance(exponent, int) and -exponent > PRICE_PLACES:
        raise OptionsError(
            field,
            f"at most {PRICE_PLACES} decimal places, not {value!r}",
            f"The max price has more decimal places than prices have (at most {PRICE_PLACES}).",
        )
    return price


def check_max_price(
    price: Decimal, gpu: str, catalog: Catalog, confirmed: bool, field: str = "max_price"
) -> None:
    """Refuse a max price for ``gpu`` that makes no sense: above :data:`MAX_PRICE_CEILING` times
    its on-demand price always, above :data:`CONFIRM_FACTOR` times unless ``confirmed``."""
    gt = catalog.gpu_types[gpu]
    on_demand = gt.on_demand_price
    ceiling = on_demand * MAX_PRICE_CEILING
    if price > ceiling:
        raise OptionsError(
            field,
            f"at most {ceiling} {catalog.currency}/card-hour ({MAX_PRICE_CEILING:f} times the "
            f"on-demand price {on_demand} of {gpu}), not {price}",
            f"A max price of {_money(catalog, price)} per card-hour is not a sensible bid for "
            f"{gt.display_name}: it costs {_money(catalog, on_demand)} per hour on demand. "
            f"Enter at most {_money(catalog, ceiling)}.",
        )
    if price > on_demand * CONFIRM_FACTOR and not confirmed:
        raise OptionsError(
            field,
            f"{price} {catalog.currency}/card-hour is more than {CONFIRM_FACTOR:f} times the "
            f'on-demand price {on_demand} of {gpu}; send "confirm_max_price": true to bid it',
            f"A max price of {_money(catalog, price)} per card-hour is more than ten times "
            f"what {gt.display_name} costs on demand ({_money(catalog, on_demand)} per hour). "
            "Confirm it if you mean it: your server would then almost never be reclaimed for "
            "price.",
            confirm="confirm_max_price",
        )


def _as_bool(field: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "1", "on", "yes"):
        return True
    if isinstance(value, str) and value.strip().lower() in ("false", "0", "off", "no"):
        return False
    raise OptionsError(
        field,
        f"must be true or false, not {value!r}",
        f"{LABELS.get(field, field)} must be on or off, not “{value}”.",
    )


def check_cards_fit(options: ServerOptions, catalog: Catalog, most: int) -> None:
    """A server's cards all sit on one node: refuse more than ``most``, the most cards of the
    type that any one node has (the catalog's ``max_gpus_per_server`` is only the ceiling), as a
    400 naming ``gpus`` that says the most there is. ``most`` 0 (no card of the type here at
    all) refuses nothing here: the allocator or the spot queue answer that."""
    if options.gpu == NO_GPU or most <= 0 or options.gpus <= most:
        return
    name = catalog.gpu_types[options.gpu].display_name
    raise OptionsError(
        "gpus",
        f"at most {most} x {options.gpu} fit on one node here, not {options.gpus}",
        f"The largest node here has {most} {name} cards; a server has at most {most} of them, "
        f"not {options.gpus}.",
    )


def parse_options(raw: Any, catalog: Catalog) -> ServerOptions:
    """Validate raw spawn options (JSON body or converted form) against the catalog."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise OptionsError(
            "user_options",
            f"must be a JSON object with keys {_allowed(FIELDS)}",
            "The server options could not be read.",
        )
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise OptionsError(
            unknown[0],
            f"unknown field; allowed fields: {_allowed(FIELDS)}",
            f"“{unknown[0]}” is not a server option this hub knows.",
        )
    opts = {**DEFAULTS, **{k: v for k, v in raw.items() if v is not None or k == "max_price"}}

    app_slug = opts["app"]
    if not isinstance(app_slug, str) or app_slug not in catalog.apps:
        raise OptionsError(
            "app",
            f"unknown app {app_slug!r}; allowed: {_allowed(catalog.apps)}",
            f"There is no app “{app_slug}” here; pick one of the app tiles on the home page.",
        )
    app = catalog.apps[app_slug]
    if app.image is not None:
        if "image" not in raw or raw["image"] is None:
            opts["image"] = app.image
        elif raw["image"] != app.image:
            raise OptionsError(
                "image",
                f"{app.display_name} runs in image {app.image!r}; omit image or set it to "
                f"{app.image!r}",
                f"{app.display_name} comes with its own image; leave the image choice to it.",
            )

    gpu = opts["gpu"]
    gpu_choices = [NO_GPU, *catalog.gpu_types]
    if not isinstance(gpu, str) or gpu not in gpu_choices:
        raise OptionsError(
            "gpu",
            f"unknown GPU type {gpu!r}; allowed: {_allowed(gpu_choices)}",
            f"There is no GPU type “{gpu}” here; pick one from the list, or No GPU.",
        )

    def gpu_name(slug: str) -> str:
        return (
            catalog.no_gpu.display_name if slug == NO_GPU else catalog.gpu_types[slug].display_name
        )

    if gpu == NO_GPU:
        if "gpus" in raw and raw["gpus"] not in (None, 0, 1):
            raise OptionsError(
                "gpus",
                "no-GPU mode takes no GPUs; omit gpus or choose a GPU type with gpu",
                f"{catalog.no_gpu.display_name} has no GPUs: choose a GPU type to ask for GPUs.",
            )
        gpus = 0
    else:
        gpus = _as_int("gpus", opts["gpus"])
        if not 1 <= gpus <= catalog.max_gpus_per_server:
            raise OptionsError(
                "gpus",
                f"must be between 1 and {catalog.max_gpus_per_server}, not {gpus}",
                f"A server has between 1 and {catalog.max_gpus_per_server} GPUs, not {gpus}.",
            )

    if gpu not in app_gpu_types(app, catalog):
        fits = app_gpu_types(app, catalog)
        need = f" with at least {app.min_vram_gb} GB of VRAM" if app.min_vram_gb else ""
        what = "a GPU" if gpu == NO_GPU else f"a GPU type it runs on{need}"
        raise OptionsError(
            "gpu",
            f"{app.display_name} needs {what}, not {gpu!r}; allowed for it: {_allowed(fits)}",
            f"{app.display_name} needs {'a GPU' if gpu == NO_GPU else 'a GPU' + need}: "
            f"it cannot run on {gpu_name(gpu)}. It runs on: "
            f"{', '.join(gpu_name(g) for g in fits) or 'no GPU type of this hub'}.",
        )

    image = opts["image"]
    if not isinstance(image, str) or image not in catalog.images:
        raise OptionsError(
            "image",
            f"unknown image {image!r}; allowed: {_allowed(catalog.images)}",
            f"There is no image “{image}” here; pick one from the list.",
        )
    if not catalog.images[image].supports(gpu):
        ok = [s for s, i in catalog.images.items() if i.supports(gpu)]
        raise OptionsError(
            "image",
            f"image {image!r} does not support gpu {gpu!r}; allowed for it: {_allowed(ok)}",
            f"The image {catalog.images[image].display_name} does not run on {gpu_name(gpu)}; "
            f"pick another image or GPU type.",
        )

    datasets = opts["datasets"]
    if isinstance(datasets, str):
        datasets = [datasets]
    if not isinstance(datasets, list | tuple):
        raise OptionsError(
            "datasets",
            f"must be a list of dataset slugs from: {_allowed(catalog.datasets)}",
            "The datasets could not be read; tick them in the list.",
        )
    for slug in datasets:
        if is_private(slug):
            # A user's own dataset: only its spelling is checked here; who may read it is the
            # hub's to check (spawners/storage/datasets.py, at every start).
            if parse_slug(slug) is None:
                raise OptionsError(
                    "datasets",
                    f"{slug!r} is not a dataset name; a user's dataset is written @OWNER/NAME",
                    f"“{slug}” is not a dataset name; a user's dataset is written @owner/name.",
                )
            continue
        if not isinstance(slug, str) or slug not in catalog.datasets:
            raise OptionsError(
                "datasets",
                f"unknown dataset {slug!r}; allowed: {_allowed(catalog.datasets)}",
                f"There is no dataset “{slug}” here; tick them in the list.",
            )

    pricing = opts["pricing"]
    if pricing not in PRICING:
        raise OptionsError(
            "pricing",
            f"unknown pricing {pricing!r}; allowed: {_allowed(PRICING)}",
            "Pricing is either on demand or spot.",
        )
    if pricing == "spot" and gpu == NO_GPU:
        raise OptionsError(
            "pricing",
            "spot pricing needs a GPU type; no-GPU mode is on-demand",
            f"Spot pricing is for GPUs: {catalog.no_gpu.display_name} is always on demand.",
        )

    confirm = _as_bool("confirm_max_price", opts["confirm_max_price"])
    max_price = opts["max_price"]
    if max_price is not None:
        max_price = parse_max_price(max_price)
        if pricing == "spot":
            check_max_price(max_price, gpu, catalog, confirm)
    if pricing == "spot" and max_price is None:
        # A bid defaults to the on-demand price: spot never costs more than on-demand.
        max_price = catalog.gpu_types[gpu].on_demand_price

    wait = _as_bool("wait", opts["wait"])
    windows_only = _as_bool("windows_only", opts["windows_only"])
    for name, value in (
        ("wait", wait),
        ("windows_only", windows_only),
        ("confirm_max_price", confirm),
    ):
        if value and pricing != "spot":
            raise OptionsError(
                name,
                'applies to spot requests only; set "pricing": "spot"',
                f"{LABELS[name]} is for spot servers only: choose spot pricing, or leave it off.",
            )

    course = opts["course"]
    if course is not None and (not isinstance(course, str) or not COURSE_RE.match(course)):
        raise OptionsError(
            "course",
            f"must be a course name (lowercase letters, digits, '-'), not {course!r}",
            f"“{course}” is not a course name.",
        )

    return ServerOptions(
        course=course,
        image=image,
        gpu=gpu,
        gpus=gpus,
        datasets=tuple(dict.fromkeys(datasets)),
        pricing=pricing,
        max_price=max_price,
        confirm_max_price=confirm,
        wait=wait,
        windows_only=windows_only,
        app=app_slug,
    )


def options_from_form(form: dict[str, list[str]]) -> dict[str, Any]:
    """Turn the spawn form's fields (lists of strings) into the JSON contract."""

    def one(key: str) -> str | None:
        values = form.get(key) or []
        return values[0] if values and values[0] != "" else None

    out: dict[str, Any] = {}
    for key in ("app", "image", "gpu", "pricing", "course"):
        if (v := one(key)) is not None:
            out[key] = v
    if (v := one("gpus")) is not None and out.get("gpu") != NO_GPU:
        out["gpus"] = v  # the card count field stays on the page when No GPU is picked
    if out.get("pricing") == "spot" and (v := one("max_price")) is not None:
        out["max_price"] = v
    if out.get("pricing") == "spot":
        for key in ("wait", "windows_only", "confirm_max_price"):
            if one(key) is not None:
                out[key] = one(key)
    out["datasets"] = [d for d in form.get("datasets", []) if d]
    return out
