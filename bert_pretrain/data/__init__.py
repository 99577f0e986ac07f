"""The pretraining records: their format, the input pipeline, tokenization."""
