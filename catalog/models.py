"""The platform catalog: GPU types, prices, images, datasets, apps and models, as typed models.

The catalog is one declarative TOML file. It is validated once at start-up; every error names the
offending key (``gpu_types.a100-80g.on_demand_price``) and, where the set is closed, the allowed
values, so an operator never has to guess.
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .apps import DEFAULT_APP, App, StoreModel
from .no_gpu import NO_GPU

DEFAULT_CATALOG = Path(__file__).with_name("catalog.toml")

SLUG_RE = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
MEM_RE = re.compile(r"^\d+(?:\.\d+)?[KMGT]$")

Money = Annotated[Decimal, Field(ge=0, max_digits=12, decimal_places=6)]


JUPYTERLAB = App(
    slug=DEFAULT_APP,
    display_name="JupyterLab",
    description="Notebooks, terminals and files",
    needs_gpu=False,
    open_path="/lab",
)
SECTIONS = ("gpu_types", "images", "datasets", "apps", "models")


class CatalogError(ValueError):
    """The catalog file is missing, unreadable or invalid; the message names the key."""


def slugify(name: str) -> str:
    """``A100-80G`` -> ``a100-80g``; ``RTX 4090`` -> ``rtx-4090``."""
    return re.sub(r"[^a-z0-9]+", "-", name.strip().lower()).strip("-")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_mem(value: str) -> str:
    if not MEM_RE.match(value):
        raise ValueError(
            f"must look like '4G' or '512M' (a number and one of K, M, G, T), not {value!r}"
        )
    return value


class NoGpuMode(_Model):
    display_name: str = "No GPU"
    description: str = "write and debug code on the same disk"
    price_per_hour: Money
    # What a course session (spawn option ``course``) pays per hour; None: ``price_per_hour``.
    education_price_per_hour: Money | None = None
    cpus: float = Field(gt=0)
    mem: str

    _mem = field_validator("mem")(_check_mem)

    @model_validator(mode="after")
    def _education_below_price(self) -> NoGpuMode:
        edu = self.education_price_per_hour
        if edu is not None and edu > self.price_per_hour:
            raise ValueError(
                f"education_price_per_hour ({edu}) must not exceed price_per_hour "
                f"({self.price_per_hour})"
            )
        return self

    @property
    def course_price(self) -> Decimal:
        """The price per hour of a course session."""
        return (
            self.price_per_hour
            if self.education_price_per_hour is None
            else self.education_price_per_hour
        )


class GpuType(_Model):
    slug: str
    display_name: str
    vram_gb: int = Field(gt=0)
    on_demand_price: Money
    spot_floor_price: Money
    # What a course session (spawn option ``course``) on on-demand pricing pays per card-hour;
    # None: the on-demand price.
    education_price: Money | None = None
    # A monthly reservation's price per card-hour, prepaid for the month (below on-demand);
    # None: this type is not reserved by the month.
    monthly_price: Money | None = None
    cpus_per_card: float = Field(gt=0)
    mem_per_card: str
    nvml_names: list[str] = Field(
        default_factory=list,
        description="Substrings of NVML device names that are this type (e.g. 'A100 80GB').",
    )

    _mem = field_validator("mem_per_card")(_check_mem)

    @model_validator(mode="after")
    def _floor_below_on_demand(self) -> GpuType:
        if self.spot_floor_price > self.on_demand_price:
            raise ValueError(
                f"spot_floor_price ({self.spot_floor_price}) must not exceed "
                f"on_demand_price ({self.on_demand_price})"
            )
        for key in ("education_price", "monthly_price"):
            price = getattr(self, key)
            if price is not None and price > self.on_demand_price:
                raise ValueError(
                    f"{key} ({price}) must not exceed on_demand_price ({self.on_demand_price})"
                )
        return self

    @property
    def course_price(self) -> Decimal:
        """The price per card-hour of an on-demand course session."""
        return self.on_demand_price if self.education_price is None else self.education_price

    def matches(self, nvml_name: str) -> bool:
        return any(n.lower() in nvml_name.lower() for n in self.nvml_names)


class Image(_Model):
    slug: str
    display_name: str
    description: str
    preloads: list[str] = Field(default_factory=list)
    gpu_types: list[str] = Field(
        default_factory=list, description="GPU type slugs this image supports; empty means all."
    )
    docker_image: str | None = None

    def supports(self, gpu_type: str) -> bool:
        return not self.gpu_types or gpu_type in self.gpu_types or gpu_type == NO_GPU


class Dataset(_Model):
    slug: str
    display_name: str
    description: str
    size: str
    license: str
    source: str = Field(
        description="Absolute path, or 'package:PKG/sub/dir' for data inside an installed package."
    )
    read_only: bool = True

    @field_validator("read_only")
    @classmethod
    def _always_read_only(cls, value: bool) -> bool:
        if not value:
            raise ValueError("datasets are always mounted read-only; remove the key or set true")
        return value

    def resolve_source(self) -> Path:
        """The directory on this machine that holds the dataset."""
        if self.source.startswith("package:"):
            package, _, sub = self.source[len("package:") :].partition("/")
            spec = importlib.util.find_spec(package)
            if spec is None or not spec.submodule_search_locations:
                raise CatalogError(
                    f"datasets.{self.slug}.source: package {package!r} is not installed"
                )
            return Path(next(iter(spec.submodule_search_locations))) / sub
        return Path(self.source)


class ServerLimits(_Model):
    """Limits every server gets whatever its mode (CPUs and memory come with the mode)."""

    pids: int = Field(
        1024, ge=32, description="Most processes and threads a server may run at once."
    )
    open_files: int = Field(
        4096, ge=64, description="Most files one process of a server may hold open (nofile)."
    )


GiB = 2**30


class Storage(_Model):
    """Each user's persistent home: its free size, what more costs, and how long it is kept.

    Sizes are in GB (2**30 bytes; a fraction is allowed, so a test can use a small home). The
    home's size is its quota: a write past it fails in the writer's own code (ENOSPC/EDQUOT)."""

    free_gb: Decimal = Field(
        Decimal(50),
        gt=0,
        max_digits=12,
        decimal_places=6,
        description="Quota every user gets free of charge.",
    )
    max_gb: Decimal = Field(
        Decimal(500),
        gt=0,
        max_digits=12,
        decimal_places=6,
        description="Most a user may raise their own quota to (operator's limit).",
    )
    price_per_gb_day: Money = Field(
        Decimal("0.01"), description="Price of each GB of quota above free_gb, per day."
    )
    tmp_gb: Decimal = Field(
        Decimal(10),
        gt=0,
        max_digits=12,
        decimal_places=6,
        description="Size of each server's /tmp (scratch, wiped when the server stops).",
    )
    shm_gb: Decimal = Field(
        Decimal(2),
        gt=0,
        max_digits=12,
        decimal_places=6,
        description="Size of each server's /dev/shm (wiped when the server stops).",
    )
    keep_days: int = Field(
        90,
        ge=1,
        description="Days a home is kept after its user last ran a server; then it is released.",
    )
    warn_days: tuple[int, ...] = Field(
        (14, 3), description="Days before release at which the user is warned (each once)."
    )

    @model_validator(mode="after")
    def _check_sizes(self) -> Storage:
        if self.max_gb < self.free_gb:
            raise ValueError(f"max_gb ({self.max_gb}) must be at least free_gb ({self.free_gb})")
        if any(d < 1 or d >= self.keep_days for d in self.warn_days):
            raise ValueError(
                f"warn_days must each be between 1 and keep_days - 1 ({self.keep_days - 1})"
            )
        return self

    def bytes_of(self, gb: Decimal) -> int:
        """GB (2**30 bytes, fractions allowed) as a whole number of bytes."""
        return int(gb * GiB)

    @property
    def free_bytes(self) -> int:
        return self.bytes_of(self.free_gb)

    @property
    def max_bytes(self) -> int:
        return self.bytes_of(self.max_gb)


class BillingSettings(_Model):
    """What the billing service reads from the catalog besides prices (``[billing]``)."""

    low_balance_thresholds: tuple[
        Annotated[Decimal, Field(max_digits=12, decimal_places=6)], ...
    ] = Field(
        (Decimal(0), Decimal(10)),
        description="Balances (in the currency) for which billing's metrics count the "
        "accounts below each (gpulab_billing_balances_below{threshold}).",
    )


class Catalog(_Model):
    currency: str = Field(pattern=r"^[A-Z]{3}$")
    trial_credit: Money
    max_gpus_per_server: int = Field(8, ge=1, le=64)
    no_gpu: NoGpuMode
    gpu_types: dict[str, GpuType]
    images: dict[str, Image]
    datasets: dict[str, Dataset] = Field(default_factory=dict)
    # A catalog from before apps existed still launches JupyterLab.
    apps: dict[str, App] = Field(default_factory=lambda: {DEFAULT_APP: JUPYTERLAB})
    models: dict[str, StoreModel] = Field(default_factory=dict)
    limits: ServerLimits = Field(default_factory=ServerLimits)
    storage: Storage = Field(default_factory=Storage)
    billing: BillingSettings = Field(default_factory=BillingSettings)

    @model_validator(mode="before")
    @classmethod
    def _inject_slugs(cls, data: Any) -> Any:
        # Slugs are the TOML table names; copy them into the entries so each model knows its own.
        if isinstance(data, dict):
            data = dict(data)
            for section in SECTIONS:
                entries = data.get(section)
                if isinstance(entries, dict):
                    data[section] = {
                        k: ({**v, "slug": k} if isinstance(v, dict) else v)
                        for k, v in entries.items()
                    }
        return data

    @model_validator(mode="after")
    def _check_references(self) -> Catalog:
        for section in SECTIONS:
            for slug in getattr(self, section):
                if not SLUG_RE.match(slug) or slug == NO_GPU:
                    raise ValueError(
                        f"{section}.{slug}: slugs are lowercase letters, digits and '-' "
                        f"(and not {NO_GPU!r}), e.g. {slugify(slug) or 'a100-80g'!r}"
                    )
        if not self.images:
            raise ValueError("images: at least one image is required")
        for image in self.images.values():
            for gpu in image.gpu_types:
                if gpu not in self.gpu_types and gpu != NO_GPU:
                    raise ValueError(
                        f"images.{image.slug}.gpu_types: unknown GPU type {gpu!r}; "
                        f"allowed: {', '.join([NO_GPU, *self.gpu_types])}"
                    )
        for app in self.apps.values():
            if app.image is not None and app.image not in self.images:
                raise ValueError(
                    f"apps.{app.slug}.image: unknown image {app.image!r}; "
                    f"allowed: {', '.join(self.images)}"
                )
            for gpu in app.gpu_types:
                if gpu not in self.gpu_types:
                    raise ValueError(
                        f"apps.{app.slug}.gpu_types: unknown GPU type {gpu!r}; "
                        f"allowed: {', '.join(self.gpu_types)}"
                    )
        if self.apps and DEFAULT_APP not in self.apps:
            raise ValueError(f"apps: the default app {DEFAULT_APP!r} (JupyterLab) is required")
        return self

    def gpu_type_for_nvml_name(self, nvml_name: str) -> GpuType | None:
        for gpu_type in self.gpu_types.values():
            if gpu_type.matches(nvml_name):
                return gpu_type
        return None

    def public(self) -> dict[str, Any]:
        """The catalog as JSON-ready data for the form, the API and the extensions."""
        return self.model_dump(
            mode="json",
            exclude={
                "datasets": {"__all__": {"source"}},
                "models": {"__all__": {"source"}},
                "apps": {"__all__": {"command", "local_command", "local_checkout"}},
            },
        )


def _allowed_fields(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Walk ``loc`` through the model tree to list the fields allowed where an extra key was found."""
    current: Any = model
    parts = list(loc[:-1])
    while parts:
        part = parts.pop(0)
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return []
        field = current.model_fields.get(str(part))
        if field is None:
            return []
        annotation = field.annotation
        if getattr(annotation, "__origin__", None) is dict:
            # dict[str, Model]: the next part of the location is a slug
            current = annotation.__args__[1]
            if parts:
                parts.pop(0)
        else:
            current = annotation
    if isinstance(current, type) and issubclass(current, BaseModel):
        return [f for f in current.model_fields if f != "slug"]
    return []


def format_validation_error(error: ValidationError, model: type[BaseModel], where: str) -> str:
    lines = []
    for item in error.errors():
        loc = tuple(p for p in item["loc"] if not str(p).startswith("function-"))
        key = ".".join(str(p) for p in loc) or "(top level)"
        if item["type"] == "extra_forbidden":
            allowed = _allowed_fields(model, loc)
            lines.append(f"{key}: unknown key; allowed keys: {', '.join(allowed)}")
        elif item["type"] == "missing":
            lines.append(f"{key}: required key is missing")
        else:
            msg = item["msg"].removeprefix("Value error, ")
            lines.append(f"{key}: {msg}")
    return f"{where}: " + "; ".join(lines)


def parse_catalog(data: dict[str, Any], where: str = "catalog") -> Catalog:
    try:
        return Catalog.model_validate(data)
    except ValidationError as e:
        raise CatalogError(format_validation_error(e, Catalog, where)) from None


def load_catalog(path: str | Path | None = None) -> Catalog:
    """Load and validate a catalog file (the shipped default when ``path`` is empty)."""
    path = Path(path) if path else DEFAULT_CATALOG
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise CatalogError(f"{path}: catalog file not found") from None
    except tomllib.TOMLDecodeError as e:
        raise CatalogError(f"{path}: not valid TOML: {e}") from None
    return parse_catalog(data, str(path))
