"""Stage 1: corpus -> word table."""
