"""Stage 2: images -> feature store (10-crop CNN globals, Full-Network Embedding, region features)."""
