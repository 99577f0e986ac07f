"""BERT pretraining recipe: tokenization, data creation, model and training."""
