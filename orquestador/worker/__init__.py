"""The durable worker: scheduler, heartbeat, executor and shutdown."""
