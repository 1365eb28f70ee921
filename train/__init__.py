"""Stage 3: feature store + prepared dataset -> trained model, evaluation, reports."""
