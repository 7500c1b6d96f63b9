"""dapo: Decoupled Clip and Dynamic sAmpling Policy Optimization (arXiv 2503.14476)."""

__version__ = "0.1.0"
