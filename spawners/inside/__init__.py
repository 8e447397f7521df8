"""Code the hub runs inside a user's server, local process or container: stdlib only, so it
works in any image. :mod:`.launcher` starts the server (read-only datasets first); :mod:`.agent`
signals opted-in processes and runs the checkpoint command at a preemption warning.
"""
