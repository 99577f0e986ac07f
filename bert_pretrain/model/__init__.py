"""BERT: Google's model and its pretraining heads."""
