"""What this server is, as the spawner wrote it into the environment (``GPULAB_*``)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation


def _decimal(value: str | None) -> Decimal | None:
    try:
        out = Decimal((value or "").strip())
    except InvalidOperation:
        return None
    return out if out.is_finite() and out >= 0 else None


@dataclass(frozen=True)
class ServerInfo:
    user: str
    server_name: str
    mode: str
    gpu_type: str  # a catalog slug, or "none"
    gpu_count: int
    simulated: bool
    pricing: str
    price_per_hour: Decimal | None
    currency: str
    image: str
    datasets: tuple[str, ...]
    allocation_id: str
    visible_devices: tuple[str, ...]
    # When this server process started (the extension loads during start-up).
    started_at: float = field(default_factory=time.time)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None, started_at: float | None = None):
        env = dict(os.environ) if env is None else env
        gpu_type = env.get("GPULAB_GPU_TYPE") or "none"
        try:
            gpu_count = int(env.get("GPULAB_GPU_COUNT") or 0)
        except ValueError:
            gpu_count = 0
        cuda = env.get("CUDA_VISIBLE_DEVICES", "")
        return cls(
            user=env.get("JUPYTERHUB_USER", ""),
            server_name=env.get("JUPYTERHUB_SERVER_NAME", ""),
            mode=env.get("GPULAB_MODE") or ("No GPU" if gpu_type == "none" else gpu_type),
            gpu_type=gpu_type,
            gpu_count=gpu_count,
            simulated=env.get("GPULAB_GPUS_SIMULATED") == "1",
            pricing=env.get("GPULAB_PRICING") or "on-demand",
            price_per_hour=_decimal(env.get("GPULAB_PRICE_PER_HOUR")),
            currency=env.get("GPULAB_CURRENCY") or "",
            image=env.get("GPULAB_IMAGE") or "",
            datasets=tuple(d for d in (env.get("GPULAB_DATASETS") or "").split(",") if d),
            allocation_id=env.get("GPULAB_ALLOCATION_ID") or "",
            visible_devices=tuple(d for d in cuda.split(",") if d.strip()),
            started_at=time.time() if started_at is None else started_at,
        )

    @property
    def in_gpulab(self) -> bool:
        """False when this server was not started by a gpulab spawner (plain JupyterLab)."""
        return bool(self.allocation_id)

    def session_cost(self, now: float | None = None) -> Decimal | None:
        """Price x time since start, rounded half-up to 0.0001 for display (billing is exact)."""
        if self.price_per_hour is None:
            return None
        elapsed = Decimal(max(0.0, (now or time.time()) - self.started_at))
        cost = self.price_per_hour * elapsed / Decimal(3600)
        return cost.quantize(Decimal("0.0001"), rounding=ROUND_HALF_UP)

    def to_json(self, now: float | None = None) -> dict:
        now = now or time.time()
        cost = self.session_cost(now)
        return {
            "gpulab": self.in_gpulab,
            "user": self.user,
            "mode": self.mode,
            "gpu_type": self.gpu_type,
            "gpu_count": self.gpu_count,
            "simulated": self.simulated,
            "pricing": self.pricing,
            "price_per_hour": None if self.price_per_hour is None else str(self.price_per_hour),
            "currency": self.currency,
            "image": self.image,
            "datasets": list(self.datasets),
            "allocation_id": self.allocation_id,
            "started_at": self.started_at,
            "elapsed_seconds": round(now - self.started_at, 1),
            "session_cost": None if cost is None else str(cost),
        }
