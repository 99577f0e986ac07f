"""Fine-tuning a classifier on the pretrained encoder."""
