"""``python -m gpulab.ssh_service``: run the SSH gateway (the hub starts it this way)."""

from gpulab.ssh_service.app import main

main()
