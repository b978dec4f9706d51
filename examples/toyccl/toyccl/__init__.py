"""toyccl: an example out-of-tree torch.distributed backend, registered on import as "toyccl".

Pure Python and CPU only: every op moves pickled tensors through the c10d store the group
is created with. It exists to show vendors how a backend plugs in and is certified.
"""

from toyccl.backend import BACKEND_NAME, ToyProcessGroup, register

register()

__all__ = ["BACKEND_NAME", "ToyProcessGroup", "register"]
