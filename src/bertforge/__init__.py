"""bertforge: pretrain BERT from scratch on your own text."""

__version__ = "0.1.0"
