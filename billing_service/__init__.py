"""The billing service: a JupyterHub service (its own process) that meters kernel- and app-seconds,
rates them from the catalog and keeps balances. It imports only the catalog from the rest of
gpulab and talks to the hub over its REST API. See billing_service/README.md.
"""
