"""BERT pretraining recipe: tokenization, data creation, model and training."""

import os

# TensorFlow's C++ start-up lines (INFO) hide a tool's own; warnings and errors stay.
# Set before any module of the package imports TensorFlow; an exported value wins.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
