"""The one spelling of "no GPU": :data:`NO_GPU`, and the two crossings to the allocator's cards.

A user's choice of GPU type is always a string, on every floor (the form and the JSON API's
``gpu``, ``ServerOptions.gpu``, course limits, the launch plan, billing's sessions and
statements, the container labels and ``GPULAB_GPU_TYPE`` inside a server): a catalog GPU type
slug, or :data:`NO_GPU` for a server without GPUs. The catalog refuses ``NO_GPU`` as a slug, so
the two never meet.

One different fact keeps ``None``: the type of the *cards a server holds* (the allocator's
``Allocation.gpu_type`` and its persisted ledger, a device's ``GpuDevice.gpu_type``), where
``None`` means "holds no cards" (or "a card of no catalog type"). That is hardware bookkeeping,
not a user's choice; the places that turn one into the other go through :func:`card_type` and
:func:`gpu_choice`, nowhere else.
"""

from __future__ import annotations

NO_GPU = "none"


def card_type(gpu: str) -> str | None:
    """The type of cards a server of the choice ``gpu`` holds: None (no cards) for NO_GPU."""
    return None if gpu == NO_GPU else gpu


def gpu_choice(cards: str | None) -> str:
    """The choice a server holding cards of type ``cards`` (None: no cards) runs as."""
    return NO_GPU if cards is None else cards
