"""tb-example-engine: the smallest useful TorchBurn engine, as a template for your own."""

__version__ = "0.1.0"
