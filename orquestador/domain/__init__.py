"""Pure code: flow definitions, decision tables, JSON Pointer updates, canonical hashing."""
