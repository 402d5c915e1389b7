"""Cross-checks against PyTorch: twins of every op, layer and model, checked by autograd.

Nothing here is imported by ``numpy_transformer``; the test modules skip without torch.
"""
