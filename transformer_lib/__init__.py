"""transformer_lib: the encoder-decoder Transformer of "Attention Is All You Need", built in the
course's notebooks (notebooks/NN_*.ipynb) and exported here. Import what you need from its modules,
e.g. `from transformer_lib.model import Transformer`; see README.md for what each notebook exports."""

__version__ = "0.1.0"
