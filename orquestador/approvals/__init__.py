"""Approvals: a person's decision as a durable wait (approval@1, SPEC section 19)."""
