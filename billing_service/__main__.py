"""``python -m gpulab.billing_service``: run the billing service (the hub starts it this way)."""

from gpulab.billing_service.app import main

main()
