"""Stand-in `torch_npu` (test fixture): importing it registers nothing new; the stand-in
`torch` has the `npu` device already (see python/tests/fakes/README.md)."""
import torch  # noqa: F401

npu = torch.npu
__version__ = "0.0-hixl-fixture"
