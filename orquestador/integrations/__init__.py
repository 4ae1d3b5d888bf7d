"""Operator-configured integrations: HTTP routes read from INTEGRATIONS_FILE."""
