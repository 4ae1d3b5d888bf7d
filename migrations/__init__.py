"""Alembic migration tree, shipped as orquestador.migrations."""
