"""This node's GPUs: what exists (NVML or simulated), who holds which card, and the pool that
ties them to the catalog. Nothing here knows about the spot market or any spawner class.
"""
