"""Read the user's balance from gpulab's billing service, defensively.

Billing is a separate service that may be absent, starting, or of a newer version. Whatever it
answers is turned into one small shape the frontend understands; anything else becomes
``{"available": False, "reason": ...}`` so the status bar says "balance unavailable" instead of
breaking.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any


def _money(value: Any) -> str | None:
    # Billing gives money as {"micro": int, "exact": "9.996800", "display": "10.00"}.
    if isinstance(value, dict):
        value = value.get("exact")
    if isinstance(value, bool) or value is None:
        return None
    try:
        out = Decimal(str(value).strip())
    except InvalidOperation:
        return None
    return str(out) if out.is_finite() else None


def _seconds(value: Any) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return max(0.0, float(value))
    return None


def _warnings(data: dict[str, Any]) -> list[str]:
    out: list[str] = []
    raw = data.get("warnings")
    if isinstance(raw, str):
        raw = [raw]
    if isinstance(raw, list):
        for item in raw:
            if isinstance(item, str):
                out.append(item)
            elif isinstance(item, dict) and isinstance(item.get("message"), str):
                out.append(item["message"])
    if isinstance(data.get("warning"), str) and data["warning"]:
        out.append(data["warning"])
    return out


def unavailable(reason: str) -> dict[str, Any]:
    return {"available": False, "reason": reason}


def normalize_balance(data: Any, default_currency: str = "") -> dict[str, Any]:
    """Billing's balance answer (``GET /services/billing/api/v1/users/NAME/balance``) ->
    ``{available, balance, currency, burn_rate_per_hour, time_left_seconds, warnings}``; an
    answer without a readable balance is "unavailable"."""
    if not isinstance(data, dict):
        return unavailable("billing answered something that is not a JSON object")
    balance = _money(data.get("balance"))
    if balance is None:
        return unavailable("billing's answer has no readable balance")
    currency = data.get("currency") if isinstance(data.get("currency"), str) else default_currency
    return {
        "available": True,
        "balance": balance,
        "currency": currency,
        "burn_rate_per_hour": _money(data.get("burn_rate_per_hour")),
        "time_left_seconds": _seconds(data.get("time_left_seconds")),
        "warnings": _warnings(data),
    }
