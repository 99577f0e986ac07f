"""The pretraining run's parts: the graph, the optimizer, checkpoints, meters, logs."""
