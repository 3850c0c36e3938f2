"""bertlint: find training-loop, mixed-precision, checkpointing and memory mistakes in transformer
training scripts before the run (static lint), and prove them during it (``--verify``).

The lint path must never import torch, transformers or accelerate.
"""

__version__ = "0.1.0"
