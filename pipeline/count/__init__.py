"""The count stage: corpus -> word table."""
