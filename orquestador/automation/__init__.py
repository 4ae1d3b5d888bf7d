"""Automation on machines: plans bind flows to moments, platform events start them."""
