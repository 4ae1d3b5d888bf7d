"""The history tables at scale: their months ahead, their retention and their export."""
