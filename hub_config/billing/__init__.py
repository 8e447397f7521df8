"""Billing as the hub sees it, inside the hub process (the billing service itself is
:mod:`gpulab.billing_service`, a separate process the hub reaches only over HTTP).

- :mod:`.observer`: the hub watches every server itself (CPU and GPU work, held cards): what
  billing charges and the idle culler reads never rests on what a server says;
- :mod:`.hooks`: the start's balance check, session open and close, and the billing service's
  process when the hub starts it;
- :mod:`.notices`: what the platform did to a user's server by itself, for the user to read.
"""
