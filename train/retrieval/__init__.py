"""The retrieval task: training a family (fit, validation), evaluating (evaluate/), reading a run or a model
folder back (loaded, open, model_folder), queries, comparisons, reports and exports."""
