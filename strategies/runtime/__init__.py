"""Execute a layer-wise Strategy on torch.distributed."""
