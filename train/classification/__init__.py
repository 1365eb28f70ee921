"""The text classification task (CHAIN-VSE section 5): the classifier (model), its training (fit), a run
read back (run), its evaluation (evaluate) and metrics."""
