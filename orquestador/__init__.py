"""orquestador: a durable workflow orchestrator on PostgreSQL."""
