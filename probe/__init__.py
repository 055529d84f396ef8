"""probe: why Transformer-RNN hybrids do or do not length-generalize, and Delayed Attention Training."""

__version__ = "0.1.0"
